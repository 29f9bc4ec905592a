"""Puts the repository root on sys.path so the examples run from a plain checkout.

With onnxjob installed (pip install -e .) this does nothing that matters.
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
