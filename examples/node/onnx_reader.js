// The two things a train step's caller needs from an .onnx file, read straight from its
// protobuf encoding: the model's metadata properties and the graph's initializers (the
// exported variables' initial values). onnxruntime-node exposes neither.
'use strict';

const ort = require('onnxruntime-node');

// ONNX TensorProto data types -> onnxruntime-node tensor types and their arrays
const TYPES = {
  1: ['float32', Float32Array],
  6: ['int32', Int32Array],
  7: ['int64', BigInt64Array],
  11: ['float64', Float64Array],
};

function readVarint(buf, pos) {
  let value = 0;
  let scale = 1;
  let byte;
  do {
    byte = buf[pos++];
    value += (byte & 0x7f) * scale;
    scale *= 128;
  } while (byte & 0x80);
  return [value, pos];
}

// The fields of one protobuf message in buf[start, end): {field, value} for varints,
// {field, start, end} for the others.
function* fields(buf, start = 0, end = buf.length) {
  let pos = start;
  while (pos < end) {
    let key;
    [key, pos] = readVarint(buf, pos);
    const field = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === 0) {
      let value;
      [value, pos] = readVarint(buf, pos);
      yield { field, value };
    } else if (wire === 2) {
      let length;
      [length, pos] = readVarint(buf, pos);
      yield { field, start: pos, end: pos + length };
      pos += length;
    } else if (wire === 1 || wire === 5) {
      const size = wire === 1 ? 8 : 4;
      yield { field, start: pos, end: pos + size };
      pos += size;
    } else {
      throw new Error(`unsupported protobuf wire type ${wire} at byte ${pos}`);
    }
  }
}

const text = (buf, f) => buf.toString('utf8', f.start, f.end);

function readTensor(buf, f) {
  const tensor = { dims: [] };
  for (const e of fields(buf, f.start, f.end)) {
    if (e.field === 1 && e.value !== undefined) {
      tensor.dims.push(e.value);
    } else if (e.field === 1) {          // packed dims
      for (let pos = e.start; pos < e.end;) {
        let dim;
        [dim, pos] = readVarint(buf, pos);
        tensor.dims.push(dim);
      }
    } else if (e.field === 2) {
      tensor.dataType = e.value;
    } else if (e.field === 8) {
      tensor.name = text(buf, e);
    } else if (e.field === 9) {
      tensor.raw = buf.subarray(e.start, e.end);
    }
  }
  if (!TYPES[tensor.dataType] || !tensor.raw) {
    throw new Error(`initializer ${tensor.name}: only raw float32/int32/int64/float64 data is read`);
  }
  return tensor;
}

// {metadata: {key: value}, initializers: {name: {dims, dataType, raw}}} of a ModelProto.
function readOnnx(buf) {
  const metadata = {};
  const initializers = {};
  for (const f of fields(buf)) {
    if (f.field === 14) {                // ModelProto.metadata_props
      const entry = {};
      for (const e of fields(buf, f.start, f.end)) entry[e.field] = text(buf, e);
      metadata[entry[1]] = entry[2];
    } else if (f.field === 7) {          // ModelProto.graph
      for (const g of fields(buf, f.start, f.end)) {
        if (g.field === 5) {             // GraphProto.initializer
          const tensor = readTensor(buf, g);
          initializers[tensor.name] = tensor;
        }
      }
    }
  }
  return { metadata, initializers };
}

// An initializer as an ort.Tensor (its bytes copied to an aligned buffer).
function toOrtTensor(tensor) {
  const [type, ArrayType] = TYPES[tensor.dataType];
  const { raw } = tensor;
  const data = new ArrayType(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
  return new ort.Tensor(type, data, tensor.dims);
}

module.exports = { readOnnx, toOrtTensor };
