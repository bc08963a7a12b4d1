// airlock's JavaScript kernel: one persistent Node.js realm per code context.
//
// Started by the daemon as `node -e <this file> <nonce>` inside the sandbox;
// the same line protocol as the Python kernel (see python.py): one JSON
// request per line on stdin, user output on fds 1 and 2, the kernel's own
// messages as "\x1eairlock-<nonce> " + JSON + "\n" lines on the same fds,
// and an "end" message on both when an execution is over. Cells run with
// vm.runInThisContext, so top-level declarations persist between them and
// the value of the last expression statement is the cell's result.
'use strict';
(() => {
  const fs = require('fs');
  const util = require('util');
  const vm = require('vm');

  const nonce = process.argv[process.argv.length - 1];
  process.argv = [process.argv[0]];
  const mark = '\x1eairlock-' + nonce + ' ';
  const emit = (fd, message) => {
    const data = Buffer.from(mark + JSON.stringify(message) + '\n');
    let written = 0;
    while (written < data.length) {
      try {
        written += fs.writeSync(fd, data, written);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
      }
    }
  };

  globalThis.require = require;
  globalThis.module = module;
  globalThis.exports = module.exports;
  globalThis.display = (...values) => {
    for (const value of values) {
      emit(1, { type: 'result', main: false, data: { text: util.inspect(value) } });
    }
  };
  // A rejection or exception nobody handles is the cell's business, not a
  // reason for the kernel to die.
  process.on('uncaughtException', (e) => process.stderr.write(String(e && e.stack || e) + '\n'));
  process.on('unhandledRejection', (e) => process.stderr.write(String(e && e.stack || e) + '\n'));

  // Outside a cell an interrupt has nothing to stop.
  process.on('SIGINT', () => {});

  const report = (e) => {
    const isError = e instanceof Error || (e && typeof e === 'object' && 'stack' in e);
    emit(1, {
      type: 'error',
      name: isError && e.name ? String(e.name) : 'Error',
      value: isError ? String(e.message) : util.inspect(e),
      traceback: isError && e.stack ? String(e.stack) : util.inspect(e),
    });
  };

  let count = 0;
  const runCell = async (request) => {
    count += 1;
    const env = request.env || {};
    const saved = {};
    for (const name of Object.keys(env)) {
      saved[name] = process.env[name];
      process.env[name] = String(env[name]);
    }
    try {
      let value = vm.runInThisContext(String(request.code || ''), {
        filename: `<cell-${count}>`,
        // An interrupt (the client gave up) ends a busy cell with an error.
        breakOnSigint: true,
      });
      if (value && typeof value.then === 'function') value = await value;
      if (value !== undefined) {
        emit(1, { type: 'result', main: true, data: { text: util.inspect(value) } });
      }
    } catch (e) {
      report(e);
    } finally {
      for (const name of Object.keys(saved)) {
        if (saved[name] === undefined) delete process.env[name];
        else process.env[name] = saved[name];
      }
    }
    emit(1, { type: 'count', n: count });
    emit(1, { type: 'end' });
    emit(2, { type: 'end' });
  };

  const queue = [];
  let busy = false;
  const drain = async () => {
    if (busy) return;
    busy = true;
    while (queue.length > 0) await runCell(queue.shift());
    busy = false;
  };
  let pending = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    pending += chunk;
    let newline;
    while ((newline = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      try {
        queue.push(JSON.parse(line));
      } catch (e) {
        continue;
      }
    }
    drain();
  });
  process.stdin.on('end', () => process.exit(0));
})();
