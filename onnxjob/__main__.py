"""Command line.

    python -m onnxjob run script.py [ARGS...]           run a script written for OneFlow
                                                        (or a folder or zip with __main__.py)
    python -m onnxjob run -m package.module [ARGS...]   ... a module, as `python -m` runs it
    python -m onnxjob run --nproc N script.py [ARGS...] N data-parallel ranks (onnxjob/launch.py;
                                                        `--nproc N -m package.module` too)
                                                        (or flow.config.cpu_device_num(N) in
                                                        the script: onnxjob/frontend/ranks.py)
    python -m onnxjob export script.py:job -o m.onnx    write a job function as an .onnx file
                     [--dynamic-batch]                  ... with a symbolic batch axis
    python -m onnxjob settings [--markdown]             the ONNXJOB_* variables and their values

`run` executes the script as `__main__` with `import oneflow` (and
`oneflow.compatible.single_client`) resolving to onnxjob in this process, the worker
processes the script starts with multiprocessing (spawn, forkserver or fork) and the
Python programs it runs as subprocesses, not elsewhere; the script's directory first on
`sys.path` and `sys.argv` = [script, ARGS...], and the names NumPy and Python removed since
OneFlow's releases (np.float, collections.Mapping, ...) answering as they did then, with a
warning each (compat/removed_names.py). With `-m`, the module (programs started as
`python3 -m package.train`, whose relative imports need their package) runs as `python -m`
runs it: the current directory first on `sys.path`, `sys.argv[0]` the module's file.

`export` imports the script (not as __main__, so its training loop does not start),
compiles the named job and writes it with the variables' initial values, or with the
values of `--checkpoint DIR` when given; `--dynamic-batch` writes the batch axis of a
predict job's placeholders and outputs as the symbolic dimension "batch" (any number of
rows; flow.export(..., dynamic_batch=True)). Scripts written for OneFlow work here too.

`settings` prints every ONNXJOB_* environment variable (onnxjob/settings.py) with its
current value or default, what it takes and what it does, then any unknown ONNXJOB_*
variable set here; `--markdown` prints the table of docs/settings.md instead.
"""
import argparse
import os
import runpy
import sys
import zipfile


def _script_path(parser, script):
    """`script` as an absolute path: a file, or as Python takes them, a folder or a zip
    archive with a __main__.py."""
    if not os.path.isfile(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
        parser.error(f"no such script: {script}")
    return os.path.abspath(script)


def _script_folder(script):
    """What `python script` puts first on sys.path: the script's folder, or a folder or
    zip archive itself."""
    if os.path.isdir(script) or zipfile.is_zipfile(script):
        return script
    return os.path.dirname(script)


def run_script(script, args):
    """Run `script` as __main__ with the oneflow alias installed (see the module doc)."""
    from onnxjob.compat import alias_in_child_processes, install_for_oneflow_scripts
    install_for_oneflow_scripts()
    sys.argv = [script] + list(args)
    sys.path.insert(0, _script_folder(script))
    alias_in_child_processes()
    runpy.run_path(script, run_name="__main__")


def run_module(module, args):
    """Run `module` as `python -m module args` does, with the oneflow alias installed."""
    from onnxjob.compat import alias_in_child_processes, install_for_oneflow_scripts
    install_for_oneflow_scripts()
    sys.argv = [module] + list(args)
    sys.path.insert(0, os.getcwd())
    alias_in_child_processes()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def export_job(parser, target, output, checkpoint, dynamic_batch=False):
    script, sep, job_name = target.rpartition(":")
    if not sep or not script:
        parser.error("target must look like script.py:job_name")
    script = _script_path(parser, script)
    from onnxjob.compat import install_for_oneflow_scripts
    from onnxjob.frontend import ranks
    install_for_oneflow_scripts()
    ranks.exporting(script)
    sys.path.insert(0, _script_folder(script))
    namespace = runpy.run_path(script, run_name="__onnxjob_export__")
    job = namespace.get(job_name)
    if job is None or not hasattr(job, "job"):
        parser.error(f"{script} defines no job function named {job_name!r}")
    import onnxjob as flow
    if checkpoint:
        flow.load_variables(flow.checkpoint.get(checkpoint))
    flow.export(job, output, dynamic_batch=True if dynamic_batch else None)
    print(f"wrote {output}")


def _module_run(argv):
    """(ranks, module, its arguments) of `run [--nproc N] -m MODULE [ARGS...]` (as torchrun
    takes `--nproc_per_node N -m MODULE`), else None: everything after MODULE is the
    module's, so argparse must not see it."""
    if argv[:1] != ["run"]:
        return None
    rest, nproc = argv[1:], 1
    if rest[:1] == ["--nproc"] and len(rest) > 1 and rest[1].isdigit():
        rest, nproc = rest[2:], int(rest[1])
    elif rest[:1] and rest[0].startswith("--nproc=") and rest[0][8:].isdigit():
        rest, nproc = rest[1:], int(rest[0][8:])
    if rest[:1] == ["-m"] and len(rest) > 1:
        return nproc, rest[1], rest[2:]
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m onnxjob")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script written for OneFlow with onnxjob")
    run.add_argument("--nproc", type=int, default=1,
                     help="ranks of a data-parallel run on this machine (torch.distributed)")
    run.add_argument("-m", dest="module", metavar="MODULE",
                     help="run this module as `python -m MODULE` would, instead of a script")
    run.add_argument("script", help="the script (its `import oneflow` gets onnxjob)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    exp = sub.add_parser("export", help="write a job function as an .onnx file")
    exp.add_argument("target", help="path/to/script.py:job_name")
    exp.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    exp.add_argument("--checkpoint", help="load variables from this checkpoint directory first")
    exp.add_argument("--dynamic-batch", action="store_true",
                     help="write the batch axis as a symbolic dimension (predict jobs)")
    table = sub.add_parser("settings", help="list the ONNXJOB_* environment variables")
    table.add_argument("--markdown", action="store_true",
                       help="print the Markdown table of docs/settings.md (no current values)")
    argv = sys.argv[1:] if argv is None else list(argv)
    module_run = _module_run(argv)
    if module_run is not None:
        # the module's own arguments follow it, as after `python -m MODULE`
        nproc, module, module_args = module_run
        if nproc > 1:
            from onnxjob.launch import launch
            sys.exit(launch(["-m", module, *module_args], nproc))
        run_module(module, module_args)
        return
    args = parser.parse_args(argv)
    if args.command == "settings":
        from onnxjob import settings
        print(settings.markdown_table().rstrip("\n") if args.markdown else settings.describe())
        return
    if args.command == "run" and args.nproc > 1:
        from onnxjob.launch import launch
        sys.exit(launch([_script_path(parser, args.script), *args.args], args.nproc))
    if args.command == "run":
        run_script(_script_path(parser, args.script), args.args)
    else:
        export_job(parser, args.target, args.output, args.checkpoint, args.dynamic_batch)


if __name__ == "__main__":
    main()
