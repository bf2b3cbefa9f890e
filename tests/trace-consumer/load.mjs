// load.mjs FILE.json: loads a Trace Event Format file with Chrome DevTools'
// trace engine (the parser of the Performance panel, npm
// @paulirish/trace_engine, installed here by `make deps`) and prints, as one
// JSON object, what that consumer made of it: per process its name and per
// thread its name, the complete events it took as entries (count, summed
// duration in microseconds) and how many of them it placed in the thread's
// call tree (a span that does not nest or follow the others on its thread
// is left out of the tree). tests/test_chrome.py compares this with the
// trace. Exit 1 with one line when the engine refuses the file.
import fs from 'node:fs';
import * as Trace from '@paulirish/trace_engine';

// The engine reads window.DOMRect at import time in a browser; Node has none.
globalThis.DOMRect ??= class DOMRect {
  constructor(x = 0, y = 0, width = 0, height = 0) { Object.assign(this, { x, y, width, height }); }
};

async function main(file) {
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  const events = Array.isArray(json) ? json : json.traceEvents;
  if (!Array.isArray(events)) throw new Error('no traceEvents array');
  const model = Trace.TraceModel.Model.createWithAllHandlers();
  await model.parse(events);
  const parsed = model.parsedTrace();
  if (!parsed) throw new Error('the engine produced no parsed trace');
  const { Meta, Renderer } = parsed.data;
  const out = { bounds: Meta.traceBounds, processes: {} };
  for (const [pid, proc] of Renderer.processes) {
    const pn = Meta.processNames.get(pid);
    const threads = {};
    for (const [tid, th] of proc.threads) {
      const inTree = th.entries.filter(e => Renderer.entryToNode.has(e)).length;
      threads[tid] = {
        name: th.name ?? null,
        entries: th.entries.length,
        dur_us: th.entries.reduce((s, e) => s + (e.dur ?? 0), 0),
        in_tree: inTree,
        roots: th.tree ? th.tree.roots.size : 0,
      };
    }
    out.processes[pid] = { name: pn?.args?.name ?? null, threads };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main(process.argv[2]).catch(e => {
  process.stderr.write(`load.mjs: ${process.argv[2]}: ${String(e && e.message || e).split('\n')[0]}\n`);
  process.exit(1);
});
