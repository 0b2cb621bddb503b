// Times an ONNX model under ONNX Runtime (CPU EP, all graph optimizations).
// usage: node ort_run.js model.onnx inputs.json --iters N --warmup W --threads T [--out out.bin]
//        [--spin 0] [--profile PREFIX]
// inputs.json: [{"name": "x", "dims": [...], "file": "x.bin"}] (raw little-endian f32).
// Prints one JSON object with per-iteration latency percentiles.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function flag(name, def) {
  const i = process.argv.indexOf('--' + name);
  return i >= 0 ? process.argv[i + 1] : def;
}

async function main() {
  const [modelPath, inputsPath] = process.argv.slice(2, 4);
  const iters = parseInt(flag('iters', '50'), 10);
  const warmup = parseInt(flag('warmup', '10'), 10);
  const threads = parseInt(flag('threads', '2'), 10);
  const outPath = flag('out', '');
  const options = {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  };
  // --spin 0: intra-op threads sleep instead of spinning between ops
  // (session config entry session.intra_op.allow_spinning).
  if (flag('spin', '1') === '0') options.extra = {session: {intra_op: {allow_spinning: '0'}}};
  // --profile PREFIX: ORT's own per-node profile (SessionOptions.enable_profiling), written
  // to PREFIX_<date>.json when the runs end; its path is printed as "profile".
  const profilePrefix = flag('profile', '');
  if (profilePrefix) {
    options.enableProfiling = true;
    options.profileFilePrefix = profilePrefix;
  }
  const session = await ort.InferenceSession.create(modelPath, options);
  const feeds = {};
  for (const input of JSON.parse(fs.readFileSync(inputsPath, 'utf8'))) {
    const buf = fs.readFileSync(input.file);
    const data = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    feeds[input.name] = new ort.Tensor('float32', Float32Array.from(data), input.dims);
  }
  const times = [];
  let last = null;
  for (let i = 0; i < warmup + iters; ++i) {
    const t0 = process.hrtime.bigint();
    last = await session.run(feeds);
    const t1 = process.hrtime.bigint();
    if (i >= warmup) times.push(Number(t1 - t0) / 1e6);
  }
  if (outPath) {
    const out = last[session.outputNames[0]];
    fs.writeFileSync(outPath, Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength));
  }
  let profile = null;
  if (profilePrefix) {
    // The node binding's endProfiling returns nothing: the newest PREFIX* file is the one.
    session.endProfiling();
    const path = require('path');
    const dir = path.dirname(path.resolve(profilePrefix));
    const base = path.basename(profilePrefix);
    const made = fs.readdirSync(dir).filter((f) => f.startsWith(base) && f.endsWith('.json'))
        .map((f) => path.join(dir, f)).sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
    profile = made.length > 0 ? made[0] : null;
  }
  times.sort((a, b) => a - b);
  const pct = (p) => times[Math.min(times.length - 1, Math.round(p * (times.length - 1)))];
  console.log(JSON.stringify({
    impl: 'onnxruntime-node', version: require('onnxruntime-node/package.json').version,
    threads, iters, p50_ms: pct(0.5), p90_ms: pct(0.9), min_ms: times[0],
    ...(profilePrefix ? {profile} : {}),
  }));
}

main().catch((e) => { console.error(e); process.exit(1); });
