# airlock's Python kernel: one persistent interpreter per code context.
#
# Started by the daemon as `python3 -c <this file> <nonce>` inside the
# sandbox. It reads one JSON request per line ({"code": str, "env": {..}})
# from a private copy of its stdin, runs the code in one namespace that
# lives as long as the process, and reports on its stdout and stderr.
# User output (print, sys.stdout, subprocesses) goes to fds 1 and 2 as it
# would anywhere; the kernel's own messages are lines
#   "\x1eairlock-<nonce> " + JSON + "\n"
# written on private duplicates of fds 1 and 2, so they stay in order with
# the user's output on the same pipe. The daemon tells the two apart by the
# nonce; an execution ends with an "end" message on both streams, so
# everything written before it on either pipe belongs to the execution.


def _airlock_kernel():
    import ast
    import base64
    import builtins
    import json
    import linecache
    import os
    import sys
    import traceback
    import types

    nonce = sys.argv[1] if len(sys.argv) > 1 else ""
    sys.argv = [""]
    mark = ("\x1eairlock-%s " % nonce).encode()

    # Requests arrive on a private descriptor; fd 0 becomes /dev/null, so
    # input() and child processes see end of file, not the request stream.
    requests = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    control = (os.dup(1), os.dup(2))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass

    def emit(which, message):
        data = mark + json.dumps(message).encode() + b"\n"
        while data:
            try:
                data = data[os.write(control[which], data):]
            except InterruptedError:
                continue

    def flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    namespace = main.__dict__

    formats = (
        ("_repr_html_", "html"),
        ("_repr_markdown_", "markdown"),
        ("_repr_svg_", "svg"),
        ("_repr_png_", "png"),
        ("_repr_jpeg_", "jpeg"),
        ("_repr_pdf_", "pdf"),
        ("_repr_latex_", "latex"),
        ("_repr_json_", "json"),
        ("_repr_javascript_", "javascript"),
    )

    def represent(value):
        data = {"text": repr(value)}
        for method, key in formats:
            try:
                shown = getattr(value, method, None)
                if not callable(shown):
                    continue
                shown = shown()
                if isinstance(shown, tuple):
                    shown = shown[0]
                if shown is None:
                    continue
                if isinstance(shown, bytes):
                    shown = base64.b64encode(shown).decode()
                if key == "json" and not isinstance(shown, (dict, list)):
                    continue
                data[key] = shown
            except Exception:
                continue
        return data

    def display(*values):
        """Shows each value as a result of the running cell."""
        flush()
        for value in values:
            emit(0, {"type": "result", "main": False, "data": represent(value)})

    namespace["display"] = display

    kernel_code = set()

    def report(error):
        flush()
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code in kernel_code:
            tb = tb.tb_next
        lines = traceback.format_exception(type(error), error, tb)
        emit(
            0,
            {
                "type": "error",
                "name": type(error).__name__,
                "value": str(error),
                "traceback": "".join(lines),
            },
        )

    def run_cell(code, count):
        filename = "<cell-%d>" % count
        linecache.cache[filename] = (
            len(code),
            None,
            code.splitlines(True),
            filename,
        )
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), namespace)
                if value is not None:
                    namespace["_"] = value
                    flush()
                    emit(0, {"type": "result", "main": True, "data": represent(value)})
        except BaseException as error:  # SystemExit and KeyboardInterrupt too
            report(error)

    kernel_code.update({run_cell.__code__, _airlock_kernel.__code__})

    count = 0
    while True:
        try:
            line = requests.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            request = json.loads(line)
        except ValueError:
            continue
        count += 1
        env = request.get("env") or {}
        saved = {name: os.environ.get(name) for name in env}
        try:
            os.environ.update(env)
            run_cell(request.get("code", ""), count)
        except BaseException as error:
            report(error)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        while True:
            try:
                flush()
                emit(0, {"type": "count", "n": count})
                emit(0, {"type": "end"})
                emit(1, {"type": "end"})
                break
            except KeyboardInterrupt:
                continue


_airlock_kernel()
