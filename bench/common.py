"""Helpers shared by the benchmarks: the doc models' train jobs, interleaved rounds,
medians, ratio tables. Callers put tests/ on sys.path (models.py lives there)."""
import contextlib
import json
import math
import statistics
import time


def add_timing_args(parser, rounds=7, calls=10):
    """--threads / --rounds / --calls, shared by the benchmarks."""
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for both sides")
    parser.add_argument("--rounds", type=int, default=rounds,
                        help="interleaved rounds (median taken)")
    parser.add_argument("--calls", type=int, default=calls, help="calls timed per round")
    return parser


def resnet_batch(batch, size=224, seed=0):
    """A random ImageNet-shaped batch: images (batch, 3, size, size) and int32 labels."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return (rng.random((batch, 3, size, size), dtype=np.float32),
            rng.integers(0, 1000, batch).astype(np.int32))


def first_call(fn, *args, label=None):
    """Seconds of one call of `fn(*args)` (a job's first: compile, sessions, first step).
    With `label`, also prints where they went: the job's compile (trace and passes), its
    onnxruntime sessions, and the rest (the first run: on CUDA cuDNN's algorithm search
    and the CUDA graph's capture)."""
    with phases(timed=label is not None) as spent:
        start = time.perf_counter()
        try:
            fn(*args)
        finally:
            total = time.perf_counter() - start
    if label is not None:
        print(f"{label}: {total:.2f} s = compile {spent['compile']:.2f} s + sessions "
              f"{spent['sessions']:.2f} s + first run "
              f"{total - spent['compile'] - spent['sessions']:.2f} s", flush=True)
    return total


@contextlib.contextmanager
def phases(timed=True):
    """Within the block, the seconds spent compiling jobs (trace and passes) and creating
    onnxruntime sessions add up in the {"compile": s, "sessions": s} it yields."""
    from onnxjob.runtime import backend, session
    spent = {"compile": 0.0, "sessions": 0.0}
    timed_calls = [(session, "compile_job", "compile"), (backend, "create_session", "sessions")]
    originals = [getattr(module, name) for module, name, _ in timed_calls]

    def timing(original, phase):
        def call(*a, **k):
            begin = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                spent[phase] += time.perf_counter() - begin
        return call
    if timed:
        for (module, name, phase), original in zip(timed_calls, originals):
            setattr(module, name, timing(original, phase))
    try:
        yield spent
    finally:
        for (module, name, _), original in zip(timed_calls, originals):
            setattr(module, name, original)


def time_calls(fn, calls):
    """Seconds per call of `fn()` averaged over `calls` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def interleaved(candidates, rounds, calls, warmup=3, min_block_s=0.25):
    """{name: median seconds/call} with the candidates' rounds interleaved (A B A B ...).

    Each round times a block of at least `calls` calls lasting at least `min_block_s`:
    after a call, onnxruntime's and PyTorch's idle threads keep spinning for a while and
    take cores from whichever framework runs next; in short blocks that dominates (the doc
    MLP's PyTorch step measured 6.2 ms in blocks of 10 calls after onnxjob's, 2.4 ms in
    blocks of 200).
    """
    block = {}
    for name, fn in candidates.items():
        per_call = time_calls(fn, warmup)
        block[name] = max(calls, math.ceil(min_block_s / max(per_call, 1e-9)))
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(time_calls(fn, block[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def page_faults(fn, calls=3):
    """(MB of memory first touched, seconds of system time) per call of `fn()`, from the
    process's minor page faults (Linux). A framework whose allocator returns memory to the
    OS between steps (PyTorch on glibc's malloc) touches it anew each step; on a VM what
    that costs varies and mostly does not show as system time (docs/benchmarks.md: PyTorch's
    ResNet50 step ranged 0.84-1.48 s in one day, 0.79-0.82 s with glibc keeping the memory)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        fn()
    after = resource.getrusage(resource.RUSAGE_SELF)
    touched = (after.ru_minflt - before.ru_minflt) * resource.getpagesize() / 2**20
    return touched / calls, (after.ru_stime - before.ru_stime) / calls


def print_table(rows, title):
    """rows: [(label, onnxjob_s, reference_s)] -> table with the onnxjob/reference ratio."""
    print(f"\n{title}")
    print(f"{'case':32s} {'onnxjob ms':>11s} {'reference ms':>13s} {'ratio':>7s}")
    for label, ours, ref in rows:
        print(f"{label:32s} {ours * 1e3:11.3f} {ref * 1e3:13.3f} {ours / ref:7.2f}")


def dump_json(path, payload):
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)


def bench_net(name):
    """(net, kwargs) of the doc model `name` ("lenet" or "mlp") as the benchmarks run it:
    LeNet without its dropout, so both frameworks do the same work."""
    from models import lenet, mlp
    return (lenet, {"train": False}) if name == "lenet" else (mlp, {})


# bench_bert.py's bigger config (its default flags): OneFlow-Benchmark's BERT pretraining
BERT_L4 = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
           "intermediate_size": 1024, "seq_length": 128, "max_position_embeddings": 128,
           "vocab_size": 30522, "max_predictions_per_seq": 20}


def _define_model_jobs(name, batch, amp=False):
    """(train job, predict job, feeds of one train step) of `name` in the default session:
    a doc model ("lenet", "mlp"), "resnet50" (OneFlow-Benchmark's, `batch` images;
    `amp`: under enable_auto_mixed_precision) or "bert" (OneFlow-Benchmark's pretraining
    with LAMB, BERT_L4's config, `batch` sequences)."""
    import inspect
    import numpy as np
    if name == "bert":
        if amp:
            raise ValueError("amp is defined for resnet50 only")
        from bert_models import define_jobs, optimizer_args, synthetic_batch
        train_job, predict_job = define_jobs(batch, BERT_L4, optimizer_args("lamb"))
        names = inspect.signature(train_job).parameters
        return train_job, predict_job, dict(zip(names, synthetic_batch(batch, BERT_L4)))
    if name == "resnet50":
        import onnxjob as flow
        from zoo import define_jobs as define_zoo_jobs, model_args, model_builder
        config = flow.function_config()
        config.enable_auto_mixed_precision(amp)
        train_job, predict_job = define_zoo_jobs(model_builder("resnet50"), model_args(), 224,
                                                 0.01, batch, config)
        rng = np.random.default_rng(0)
        feeds = {"images": rng.random((batch, 3, 224, 224), dtype=np.float32),
                 "labels": rng.integers(0, 1000, batch).astype(np.int32)}
    else:
        if amp:
            raise ValueError("amp is defined for resnet50 only")
        from models import define_jobs, random_batch
        net, kwargs = bench_net(name)
        train_job, predict_job = define_jobs(net, kwargs)
        images, labels = random_batch()
        feeds = {"images": images, "labels": labels}
    return train_job, predict_job, feeds


def compiled_train_job(name, batch=8, amp=False):
    """Define `name`'s jobs in the (fresh) default session and run one train step; returns
    the train job's JobRuntime and a complete feed dict (the batch and every variable).
    `name`: a doc model ("lenet", "mlp") or "resnet50" (OneFlow-Benchmark's, `batch`;
    `amp`: mixed precision)."""
    from onnxjob.runtime.session import default_session
    train_job, _, feeds = _define_model_jobs(name, batch, amp)
    train_job(*feeds.values())
    session = default_session()
    runtime = session.runtimes["train_job"]
    for variable, input_name in runtime.compiled.variable_inputs.items():
        feeds[input_name] = session.variable_numpy(variable)
    return runtime, feeds


def frozen_predict_job(name, batch=8):
    """(model bytes, feeds) of `name`'s predict job with its variables as constants: the
    model a predict job runs once its variables stop changing (runtime/frozen.py)."""
    from onnxjob.runtime.frozen import frozen_model_bytes
    from onnxjob.runtime.session import default_session
    _, predict_job, feeds = _define_model_jobs(name, batch)
    predict_job(feeds["images"])
    session = default_session()
    runtime = session.runtimes[predict_job.job.name]
    values = {v: session.variable_numpy(v) for v in runtime.compiled.variable_inputs}
    model = frozen_model_bytes(runtime.model_bytes, runtime.compiled.variable_inputs, values)
    return model, {runtime.compiled.placeholder_names[0]: feeds["images"]}


def interleaved_latencies(candidates, calls, block=50, warmup=20):
    """{name: array of seconds, one per call} over `calls` calls of each candidate,
    timed one by one in interleaved blocks of `block` calls (A's block, B's block, A's ...),
    so that both sides see the same drift of the machine (see `interleaved`)."""
    import numpy as np
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in candidates}
    clock = time.perf_counter_ns
    while min(len(s) for s in samples.values()) < calls:
        for name, fn in candidates.items():
            out = samples[name]
            for _ in range(min(block, calls - len(out))):
                start = clock()
                fn()
                out.append(clock() - start)
    return {name: np.array(s, dtype=np.float64) * 1e-9 for name, s in samples.items()}


def alternating_latencies(candidates, calls, block_s=0.3, rounds=6, warmup=20):
    """{name: [array of seconds per call, one array per round]}: each candidate's calls
    timed one by one in blocks of at least `block_s` seconds, one block per candidate per
    round, until every candidate has `calls` calls and `rounds` rounds are done. The
    candidate that goes first alternates round by round (on 2 shared cores the block
    right after another framework's pays for its idle threads, see `interleaved`)."""
    import numpy as np
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    names = list(candidates)
    samples = {name: [] for name in names}
    clock = time.perf_counter_ns
    block_ns = int(block_s * 1e9)
    done = 0
    while done < rounds or min(sum(map(len, s)) for s in samples.values()) < calls:
        for name in (names if done % 2 == 0 else names[::-1]):
            fn, out = candidates[name], []
            end = clock() + block_ns
            while True:
                start = clock()
                fn()
                stop = clock()
                out.append(stop - start)
                if stop >= end:
                    break
            samples[name].append(np.array(out, dtype=np.float64) * 1e-9)
        done += 1
    return samples
