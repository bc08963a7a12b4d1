"""e2b-code-interpreter: run_code with persistent Python contexts, output,
errors, execution counts, and the context calls. Only in venvs that have the
package (the latest one: older code-interpreter releases ignore
E2B_SANDBOX_URL)."""

import asyncio

import pytest

from e2b_code_interpreter import AsyncSandbox, Sandbox


@pytest.fixture
def interpreter():
    # The code interpreter's own default template (code-interpreter-v1), as
    # users call it.
    sbx = Sandbox.create(timeout=120)
    yield sbx
    try:
        Sandbox.kill(sbx.sandbox_id)
    except Exception:
        pass


def test_run_code_result_and_stdout(interpreter):
    execution = interpreter.run_code("print('hello'); 6 * 7")
    assert execution.error is None, execution.error
    assert execution.logs.stdout == ["hello\n"]
    assert execution.logs.stderr == []
    assert execution.text == "42"
    assert any(r.is_main_result for r in execution.results)


def test_stderr(interpreter):
    execution = interpreter.run_code("import sys; print('oops', file=sys.stderr)")
    assert "".join(execution.logs.stderr) == "oops\n"


def test_state_persists_in_the_default_context(interpreter):
    interpreter.run_code("x = 20")
    assert interpreter.run_code("x + 1").text == "21"
    interpreter.run_code("import math")
    assert interpreter.run_code("math.floor(2.5)").text == "2"


def test_execution_count_increases(interpreter):
    first = interpreter.run_code("1")
    second = interpreter.run_code("2")
    assert first.execution_count is not None
    assert second.execution_count == first.execution_count + 1


def test_error_name_value_traceback(interpreter):
    execution = interpreter.run_code("def f():\n    raise ValueError('bad value')\nf()")
    assert execution.error is not None
    assert execution.error.name == "ValueError"
    assert execution.error.value == "bad value"
    assert "ValueError" in execution.error.traceback
    assert "f()" in execution.error.traceback
    # The context survives an error.
    assert interpreter.run_code("'still' + ' here'").text == "'still here'"


def test_callbacks(interpreter):
    out = []
    interpreter.run_code(
        "for i in range(3):\n    print(i)", on_stdout=lambda m: out.append(m.line)
    )
    assert "".join(out) == "0\n1\n2\n"


def test_contexts(interpreter):
    ctx = interpreter.create_code_context(cwd="/tmp")
    assert ctx.id
    assert ctx.cwd == "/tmp"
    assert ctx.language == "python"
    assert any(c.id == ctx.id for c in interpreter.list_code_contexts())

    interpreter.run_code("y = 'in ctx'", context=ctx)
    assert interpreter.run_code("y", context=ctx).text == "'in ctx'"
    assert interpreter.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    # Contexts are separate: y is not defined in the default one.
    other = interpreter.run_code("y")
    assert other.error is not None and other.error.name == "NameError"

    interpreter.restart_code_context(ctx)
    restarted = interpreter.run_code("y", context=ctx)
    assert restarted.error is not None and restarted.error.name == "NameError"

    interpreter.remove_code_context(ctx)
    assert all(c.id != ctx.id for c in interpreter.list_code_contexts())


def test_a_real_interpreter(interpreter):
    # Not faked: the code runs in the sandbox and sees its files.
    interpreter.files.write("/home/user/data.txt", "from the sandbox")
    execution = interpreter.run_code("open('/home/user/data.txt').read()")
    assert execution.text == "'from the sandbox'"
    execution = interpreter.run_code("import os; os.getpid() > 1")
    assert execution.text == "True"


def test_async_run_code():
    async def body():
        sbx = await AsyncSandbox.create(timeout=120)
        try:
            execution = await sbx.run_code("a = 2\nprint('x')\na * 21")
            assert execution.text == "42"
            assert execution.logs.stdout == ["x\n"]
            ctx = await sbx.create_code_context()
            assert (await sbx.run_code("a", context=ctx)).error.name == "NameError"
            await sbx.remove_code_context(ctx)
        finally:
            await AsyncSandbox.kill(sbx.sandbox_id)

    asyncio.run(body())


def test_rich_results_and_display(interpreter):
    code = (
        "class Bold:\n"
        "    def _repr_html_(self):\n"
        "        return '<b>bold</b>'\n"
        "    def __repr__(self):\n"
        "        return 'Bold()'\n"
        "display('shown first')\n"
        "Bold()"
    )
    execution = interpreter.run_code(code)
    assert execution.error is None, execution.error
    assert len(execution.results) == 2
    shown, main = execution.results
    assert not shown.is_main_result and shown.text == "'shown first'"
    assert main.is_main_result and main.html == "<b>bold</b>" and main.text == "Bold()"
    # A statement, or an expression that is None, has no result.
    assert interpreter.run_code("z = 1").results == []
    assert interpreter.run_code("None").results == []


def test_env_vars_last_one_execution(interpreter):
    code = "import os; repr(os.environ.get('AIRLOCK_CELL_VAR'))"
    assert interpreter.run_code(code, envs={"AIRLOCK_CELL_VAR": "set"}).text == "\"'set'\""
    assert interpreter.run_code(code).text == "'None'"


def test_subprocess_output_and_input(interpreter):
    execution = interpreter.run_code(
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo from-child; echo err-child >&2'])\n"
        "print('after')"
    )
    assert execution.logs.stdout == ["from-child\n", "after\n"]
    assert execution.logs.stderr == ["err-child\n"]
    # input() sees end of file, not the kernel's request stream.
    execution = interpreter.run_code("input()")
    assert execution.error is not None and execution.error.name == "EOFError"
    assert interpreter.run_code("'kernel fine'").text == "'kernel fine'"


def test_syntax_error_and_system_exit(interpreter):
    execution = interpreter.run_code("x = (")
    assert execution.error is not None and execution.error.name == "SyntaxError"
    execution = interpreter.run_code("import sys; sys.exit(3)")
    assert execution.error is not None and execution.error.name == "SystemExit"
    assert interpreter.run_code("1 + 1").text == "2"


def test_a_dead_kernel_is_reported_and_replaced(interpreter):
    interpreter.run_code("kept = 1")
    execution = interpreter.run_code("import os; os._exit(7)")
    assert execution.error is not None
    assert execution.error.name == "DeadKernelError"
    assert "code 7" in execution.error.value
    # The next execution gets a fresh interpreter, without the old state.
    after = interpreter.run_code("'kept' in globals()")
    assert after.error is None and after.text == "False"


def test_a_timed_out_execution_is_interrupted(interpreter):
    import e2b

    interpreter.run_code("state = 'kept'")
    with pytest.raises(e2b.TimeoutException):
        interpreter.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1)
    # The abandoned cell was interrupted: the context answers again, with
    # its state.
    execution = interpreter.run_code("state", timeout=10)
    assert execution.text == "'kept'"


def test_executions_in_one_context_run_in_turn(interpreter):
    import threading

    interpreter.run_code("log = []")
    errors = []

    def run(i):
        try:
            interpreter.run_code(f"import time\nlog.append({i}); time.sleep(0.05); log.append({i})")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    log = eval(interpreter.run_code("log").text)
    # Each cell's two appends are next to each other: no interleaving.
    assert len(log) == 8
    assert all(log[i] == log[i + 1] for i in range(0, 8, 2))


def test_javascript_context(interpreter):
    ctx = interpreter.create_code_context(language="javascript")
    assert ctx.language == "javascript"
    execution = interpreter.run_code("const a = 20; console.log('js out'); a + 22", context=ctx)
    assert execution.error is None, execution.error
    assert execution.logs.stdout == ["js out\n"]
    assert execution.text == "42"
    assert interpreter.run_code("a * 2", context=ctx).text == "40"
    execution = interpreter.run_code("null.x", context=ctx)
    assert execution.error is not None and execution.error.name == "TypeError"
    # A promise is awaited before it is shown.
    assert interpreter.run_code("Promise.resolve(5)", context=ctx).text == "5"
    by_language = interpreter.run_code("typeof a", language="javascript")
    # The default JavaScript context is not ctx.
    assert by_language.text == "'undefined'"


def test_bad_requests(interpreter):
    from e2b import NotFoundException, SandboxException

    with pytest.raises(NotFoundException):
        interpreter.remove_code_context("no-such-context")
    with pytest.raises(SandboxException):
        interpreter.run_code("1", language="cobol")
    with pytest.raises(SandboxException):
        interpreter.create_code_context(cwd="relative/dir")
    with pytest.raises(NotFoundException):
        interpreter.create_code_context(cwd="/no/such/dir")


def test_kill_mid_execution_ends_the_execution():
    import threading
    import time

    sbx = Sandbox.create(timeout=120)
    outcome = {}

    def run():
        try:
            outcome["execution"] = sbx.run_code("import time\ntime.sleep(60)", timeout=30)
        except Exception as e:  # noqa: BLE001
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1)
    Sandbox.kill(sbx.sandbox_id)
    thread.join(timeout=15)
    assert not thread.is_alive(), "run_code hung after the sandbox was killed"
    execution = outcome.get("execution")
    assert "error" in outcome or (execution is not None and execution.error is not None)


def test_credentials_are_required(interpreter):
    import httpx

    base = interpreter._jupyter_url
    headers = {"E2b-Sandbox-Id": interpreter.sandbox_id, "E2b-Sandbox-Port": "49999"}
    assert httpx.get(f"{base}/contexts", headers=headers).status_code == 401
    wrong = dict(headers, **{"E2B-Traffic-Access-Token": "tt_" + "0" * 64})
    assert httpx.get(f"{base}/contexts", headers=wrong).status_code == 401
    right = dict(headers, **{"E2B-Traffic-Access-Token": interpreter.traffic_access_token})
    assert httpx.get(f"{base}/contexts", headers=right).status_code == 200
    # The traffic token opens only the code interpreter, not envd.
    envd = dict(right, **{"E2b-Sandbox-Port": "49983"})
    assert httpx.post(f"{base}/filesystem.Filesystem/Stat", headers=envd, json={"path": "/"}).status_code == 401
