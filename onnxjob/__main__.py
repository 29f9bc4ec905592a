"""Command line: `python -m onnxjob export script.py:job -o model.onnx`.

The script is imported (not run as __main__, so its training loop does not start); the
named job is compiled and written with the variables' initial values, or with the
values of `--checkpoint DIR` when given.
"""
import argparse
import os
import runpy
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m onnxjob")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write a job function as an .onnx file")
    exp.add_argument("target", help="path/to/script.py:job_name")
    exp.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    exp.add_argument("--checkpoint", help="load variables from this checkpoint directory first")
    args = parser.parse_args(argv)

    script, sep, job_name = args.target.rpartition(":")
    if not sep or not script:
        parser.error("target must look like script.py:job_name")
    if not os.path.isfile(script):
        parser.error(f"no such script: {script}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    namespace = runpy.run_path(script, run_name="__onnxjob_export__")
    job = namespace.get(job_name)
    if job is None or not hasattr(job, "job"):
        parser.error(f"{script} defines no job function named {job_name!r}")
    import onnxjob as flow
    from onnxjob.io.export import export
    if args.checkpoint:
        flow.load_variables(flow.checkpoint.get(args.checkpoint))
    export(job, args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
