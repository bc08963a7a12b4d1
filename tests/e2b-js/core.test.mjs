// The core calls of the e2b JS SDK against a real airlock daemon:
// Sandbox.create, commands.run, files.write/read, pty, kill, and a wrong key.
//
// Run by crates/airlock/tests/e2b_sdk.rs with `node --test`, which sets
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. The SDK is the pinned one
// scripts/deps installs in /opt/airlock/e2b-js (E2B_JS_DIR to use another);
// only node's own test runner and assert are used.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { join } from 'node:path'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) {
    throw new Error(`${name} is not set: run through cargo test -p airlock --test e2b_sdk`)
  }
}
const sdkDir = process.env.E2B_JS_DIR || '/opt/airlock/e2b-js'
const require = createRequire(join(sdkDir, 'package.json'))
const { Sandbox, CommandExitError, AuthenticationError, NotFoundError } = require('e2b')

const WRONG_KEY = 'e2b_' + '0'.repeat(40)
const created = []

async function make(opts = {}) {
  const sbx = await Sandbox.create('base', { timeoutMs: 120_000, ...opts })
  created.push(sbx.sandboxId)
  return sbx
}

after(async () => {
  for (const id of created) {
    try {
      await Sandbox.kill(id)
    } catch {}
  }
})

test('create with metadata and envs, getInfo', { timeout: 60_000 }, async () => {
  const sbx = await make({ metadata: { suite: 'js' }, envs: { JS_GREETING: 'hi js' } })
  assert.ok(sbx.sandboxId)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.suite, 'js')
  assert.equal(info.state, 'running')
  const result = await sbx.commands.run('echo $JS_GREETING')
  assert.equal(result.stdout, 'hi js\n')
})

test('commands.run: output, exit codes, cwd, user', { timeout: 60_000 }, async () => {
  const sbx = await make()
  const result = await sbx.commands.run('echo out; echo err >&2')
  assert.equal(result.stdout, 'out\n')
  assert.equal(result.stderr, 'err\n')
  assert.equal(result.exitCode, 0)
  await assert.rejects(sbx.commands.run('exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e}`)
    assert.equal(e.exitCode, 3)
    return true
  })
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  const handle = await sbx.commands.run('sleep 1; echo bg', { background: true })
  assert.equal((await handle.wait()).stdout, 'bg\n')
})

test('files.write and files.read', { timeout: 60_000 }, async () => {
  const sbx = await make()
  await sbx.files.write('/home/user/js.txt', 'from js\n')
  assert.equal(await sbx.files.read('/home/user/js.txt'), 'from js\n')
  const bytes = new Uint8Array([0, 1, 2, 255])
  await sbx.files.write('/home/user/js.bin', bytes.buffer)
  const back = await sbx.files.read('/home/user/js.bin', { format: 'bytes' })
  assert.deepEqual(Array.from(back), [0, 1, 2, 255])
  assert.equal((await sbx.commands.run('cat /home/user/js.txt')).stdout, 'from js\n')
})

// The sandbox reports envd 0.6.4: metadata (0.6.2) and entries in watch
// events (0.6.3) are sent. gVisor's gofer keeps no user extended
// attributes, so there a write with metadata is refused.
test('files: metadata and watch entries', { timeout: 60_000 }, async () => {
  const sbx = await make()
  const onGvisor = process.env.AIRLOCK_TEST_TIER === 'gvisor'
  await sbx.files.makeDir('/home/user/jw')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/jw', (event) => events.push(event), {
    includeEntry: true,
    allowNetworkMounts: true,
  })
  try {
    if (onGvisor) {
      await assert.rejects(sbx.files.write('/home/user/jw/m.txt', 'x', { metadata: { by: 'js' } }), /extended attributes/)
      await sbx.files.write('/home/user/jw/m.txt', 'tagged')
    } else {
      const info = await sbx.files.write('/home/user/jw/m.txt', 'tagged', { metadata: { By: 'js' } })
      assert.deepEqual(info.metadata, { by: 'js' })
      assert.deepEqual((await sbx.files.getInfo('/home/user/jw/m.txt')).metadata, { by: 'js' })
      const moved = await sbx.files.rename('/home/user/jw/m.txt', '/home/user/jw/n.txt')
      assert.deepEqual(moved.metadata, { by: 'js' })
      const plain = await sbx.files.write('/home/user/jw/n.txt', 'plain')
      assert.equal(plain.metadata, undefined)
      assert.equal((await sbx.files.getInfo('/home/user/jw/n.txt')).metadata, undefined)
    }
    const deadline = Date.now() + 10_000
    const written = () => events.filter((e) => e.name === 'm.txt' && e.type === 'write' && e.entry)
    while (written().length === 0) {
      assert.ok(Date.now() < deadline, `no write of m.txt with an entry: ${JSON.stringify(events)}`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    assert.equal(written()[0].entry.path, '/home/user/jw/m.txt')
    for (const event of events) {
      if (event.type === 'remove' || event.type === 'rename') assert.equal(event.entry, undefined)
    }
  } finally {
    await handle.stop()
  }
})

test('pty: create, sendInput, resize, exit', { timeout: 60_000 }, async () => {
  const sbx = await make()
  const decoder = new TextDecoder()
  let shown = ''
  const term = await sbx.pty.create({
    cols: 80,
    rows: 24,
    onData: (data) => {
      shown += decoder.decode(data, { stream: true })
    },
  })
  const until = async (needle) => {
    const deadline = Date.now() + 15_000
    while (!shown.includes(needle)) {
      assert.ok(Date.now() < deadline, `the terminal never showed ${JSON.stringify(needle)}: ${JSON.stringify(shown)}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }
  const type = (text) => sbx.pty.sendInput(term.pid, new TextEncoder().encode(text))
  await type('stty size\n')
  await until('24 80\r\n')
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await type('stty size; exit\n')
  await until('30 100\r\n')
  const result = await term.wait()
  assert.equal(result.exitCode, 0)
})

// A server the sandbox runs, reached at getHost(port) (the harness's daemon
// has --sandbox-domain; with no wildcard DNS here the request goes to the
// daemon's address with that host in Host, as a resolver would send it).
test('getHost: a server inside answers with the traffic token', { timeout: 60_000 }, async () => {
  const http = await import('node:http')
  const sbx = await make()
  const port = 8000
  const host = sbx.getHost(port)
  assert.equal(host, `${port}-${sbx.sandboxId}.sandboxes.airlock.test`)
  await sbx.files.write('/tmp/hello/index.html', 'hello from js')
  await sbx.commands.run(`cd /tmp/hello && python3 -m http.server ${port} --bind 127.0.0.1`, {
    background: true,
  })
  const daemon = new URL(process.env.E2B_API_URL)
  const get = (headers) =>
    new Promise((resolve, reject) => {
      const req = http.request(
        { host: daemon.hostname, port: daemon.port, path: '/index.html', headers: { host, ...headers } },
        (res) => {
          let body = ''
          res.on('data', (chunk) => (body += chunk))
          res.on('end', () => resolve({ status: res.statusCode, body }))
        },
      )
      req.on('error', reject)
      req.end()
    })
  const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
  let answer
  for (let i = 0; i < 300; i++) {
    answer = await get(token)
    if (answer.status === 200) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(answer.status, 200, answer.body)
  assert.equal(answer.body, 'hello from js')
  assert.equal((await get({})).status, 401)
})

test('kill', { timeout: 60_000 }, async () => {
  const sbx = await make()
  await sbx.kill()
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})

test('a wrong API key is an AuthenticationError', { timeout: 60_000 }, async () => {
  await assert.rejects(Sandbox.create('base', { apiKey: WRONG_KEY, timeoutMs: 30_000 }), AuthenticationError)
})
