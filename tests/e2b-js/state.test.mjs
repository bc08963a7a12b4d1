// What the e2b JS SDK keeps of a sandbox's state against a real airlock
// daemon: a pause that keeps only the filesystem (connect boots fresh
// processes on the same files), and volumes (Volume.create, volumeMounts,
// the content API, destroy).
//
// Run by crates/airlock/tests/e2b_sdk.rs with `node --test` on the daemon
// whose `base` is a real template (a filesystem pause needs one), with
// E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_API_KEY set.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { join } from 'node:path'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) {
    throw new Error(`${name} is not set: run through cargo test -p airlock --test e2b_sdk`)
  }
}
const sdkDir = process.env.E2B_JS_DIR || '/opt/airlock/e2b-js'
const require = createRequire(join(sdkDir, 'package.json'))
const { Sandbox, Volume, VolumeError, VolumePathNotFoundError } = require('e2b')

const created = []
const volumes = []

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
  for (const id of volumes) {
    try {
      await Volume.destroy(id)
    } catch {}
  }
})

test('a filesystem pause keeps files; connect boots fresh processes', { timeout: 90_000 }, async () => {
  const sbx = await make()
  await sbx.files.write('/home/user/keep.txt', 'kept across the pause')
  const sleeper = await sbx.commands.run('sleep 600', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === sleeper.pid))
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
  assert.equal(await again.files.read('/home/user/keep.txt'), 'kept across the pause')
  const running = await again.commands.list()
  assert.ok(!running.some((p) => p.cmd === 'sleep' || (p.args || []).includes('600')), JSON.stringify(running))
  const out = await again.commands.run('echo fresh')
  assert.equal(out.stdout, 'fresh\n')
})

test('a volume carries files between sandboxes and is read from the host', { timeout: 90_000 }, async () => {
  const name = `js_${process.pid}_${Date.now()}`
  const vol = await Volume.create(name)
  volumes.push(vol.volumeId)
  assert.ok(vol.volumeId.startsWith('vol-'))
  assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId))
  const first = await make({ volumeMounts: { '/mnt/data': vol } })
  await first.files.write('/mnt/data/note.txt', 'from the first sandbox')
  await assert.rejects(Volume.destroy(vol.volumeId), VolumeError)
  await Sandbox.kill(first.sandboxId)
  const second = await make({ volumeMounts: { '/mnt/data': name } })
  assert.equal(await second.files.read('/mnt/data/note.txt'), 'from the first sandbox')
  assert.equal(await vol.readFile('/note.txt'), 'from the first sandbox')
  await vol.makeDir('/dir', { force: true })
  const written = await vol.writeFile('/dir/host.txt', 'from the host', { mode: 0o600 })
  assert.equal(written.mode, 0o600)
  assert.equal(written.uid, 1000)
  assert.equal(await second.files.read('/mnt/data/dir/host.txt'), 'from the host')
  const names = (await vol.list('/')).map((e) => e.name).sort()
  assert.deepEqual(names, ['dir', 'note.txt'])
  await assert.rejects(vol.getInfo('/missing'), VolumePathNotFoundError)
  await vol.remove('/dir')
  assert.equal(await vol.exists('/dir'), false)
  await Sandbox.kill(second.sandboxId)
  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
})
