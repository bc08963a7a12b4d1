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
