// Train the doc MLP on MNIST for one epoch from JavaScript: onnxruntime-node runs the train
// step that onnxjob exported (examples/node/prepare.py), and this loop feeds each step's
// new state back as the next step's input. No Python involved.
//
//   node train.js [BUILD_DIR] [CHECKPOINT_DIR]
//
// Prints one JSON line per step ({"step", "loss"}) and writes the learned variables to
// CHECKPOINT_DIR (default BUILD_DIR/trained) in OneFlow's checkpoint layout, which
// flow.load_variables(flow.checkpoint.get(dir)) reads back in Python.
'use strict';

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readOnnx, toOrtTensor } = require('./onnx_reader');

const CHECKPOINT_TYPES = { float32: 'kFloat', float64: 'kDouble', int32: 'kInt32', int64: 'kInt64' };

function writeVariable(root, name, tensor) {
  const dir = path.join(root, name);
  fs.mkdirSync(dir, { recursive: true });
  const { data } = tensor;   // typed arrays are little-endian on x86 and ARM
  fs.writeFileSync(path.join(dir, 'out'), Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  const dims = tensor.dims.map((d) => `  dim: ${d}\n`).join('');
  fs.writeFileSync(path.join(dir, 'meta'), `shape {\n${dims}}\ndata_type: ${CHECKPOINT_TYPES[tensor.type]}\n`);
}

function writeCheckpoint(root, spec, state, initializers) {
  fs.rmSync(root, { recursive: true, force: true });
  for (const s of spec.state) writeVariable(root, s.variable, state[s.input]);
  for (const f of spec.fixed) writeVariable(root, f.variable, toOrtTensor(initializers[f.initializer]));
  fs.writeFileSync(path.join(root, 'snapshot_done'), '');
}

async function main() {
  const build = process.argv[2] || path.join(__dirname, 'build');
  const checkpoint = process.argv[3] || path.join(build, 'trained');
  const modelPath = path.join(build, 'mlp_train_step.onnx');
  const { metadata, initializers } = readOnnx(fs.readFileSync(modelPath));
  const spec = JSON.parse(metadata['onnxjob.train_step']);
  const state = {};
  for (const s of spec.state) state[s.input] = toOrtTensor(initializers[s.initial]);

  // logSeverityLevel 3: onnxruntime warns that the `/initial` initializers are unused
  const session = await ort.InferenceSession.create(modelPath,
    { intraOpNumThreads: 1, logSeverityLevel: 3 });
  const [imagesFeed, labelsFeed] = spec.feeds;      // (batch, 784) float32, (batch,) int32
  const batch = imagesFeed.shape[0];
  const images = fs.readFileSync(path.join(build, 'train-images.u8'));
  const labels = fs.readFileSync(path.join(build, 'train-labels.u8'));
  const steps = Math.floor(labels.length / batch);

  for (let step = 0; step < steps; step++) {
    const x = new Float32Array(batch * 784);
    for (let i = 0; i < x.length; i++) x[i] = images[step * batch * 784 + i] / 255;
    const y = new Int32Array(batch);
    for (let i = 0; i < batch; i++) y[i] = labels[step * batch + i];
    const feeds = {
      ...state,
      [imagesFeed.name]: new ort.Tensor('float32', x, imagesFeed.shape),
      [labelsFeed.name]: new ort.Tensor('int32', y, labelsFeed.shape),
    };
    const results = await session.run(feeds);
    const loss = results[spec.outputs[0].name].data[0];
    console.log(JSON.stringify({ step, loss }));
    // copied: a result's data may live in memory the next run reuses
    for (const s of spec.state) {
      const next = results[s.output];
      state[s.input] = new ort.Tensor(next.type, next.data.slice(), next.dims);
    }
  }
  writeCheckpoint(checkpoint, spec, state, initializers);
  console.error(`trained ${steps} steps; variables written to ${checkpoint}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
