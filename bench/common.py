"""Timing helpers shared by the benchmarks: interleaved rounds, medians, ratio tables."""
import json
import statistics
import time


def add_timing_args(parser, rounds=7, calls=10):
    """--threads / --rounds / --calls, shared by the benchmarks."""
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for both sides")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (median taken)")
    parser.add_argument("--calls", type=int, default=calls, help="calls timed per round")
    return parser


def time_calls(fn, calls):
    """Seconds per call of `fn()` averaged over `calls` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def interleaved(candidates, rounds, calls, warmup=3):
    """{name: median seconds/call} with the candidates' rounds interleaved (A B A B ...)."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(time_calls(fn, calls))
    return {name: statistics.median(s) for name, s in samples.items()}


def print_table(rows, title):
    """rows: [(label, onnxjob_s, reference_s)] -> table with the onnxjob/reference ratio."""
    print(f"\n{title}")
    print(f"{'case':32s} {'onnxjob ms':>11s} {'reference ms':>13s} {'ratio':>7s}")
    for label, ours, ref in rows:
        print(f"{label:32s} {ours * 1e3:11.3f} {ref * 1e3:13.3f} {ours / ref:7.2f}")


def dump_json(path, payload):
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
