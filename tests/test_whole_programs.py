"""Programs as wholes, as OneFlow's documentation lays them out: training loops around jobs
with flow.train.CheckPoint save / load / init cycles (resuming, finetuning an extended
model, a predict program loading a training save, SimpleCheckPointManager), flow.Model.fit
with callbacks and checkpoints, a trained model exported with flow.saved_model and served
with flow.serving, and datasets written record by record with record_pb2 (the docs'
ofrecord_to_string.py and img2ofrecord.py layout) read back by flow.data's readers."""
import io
import os
import struct
from typing import Tuple

import numpy as np
import pytest
from PIL import Image

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
from onnxjob.io import images as image_io

BATCH = 8
RNG = np.random.default_rng(7)
IMAGES = RNG.random((4 * BATCH, 1, 6, 6), dtype=np.float32)
LABELS = (IMAGES.reshape(len(IMAGES), -1).mean(1) * 30).astype(np.int32) % 4


def batches(n):
    """The first `n` (images, labels) batches of the fixed dataset, round and round."""
    return [(IMAGES[j * BATCH:(j + 1) * BATCH], LABELS[j * BATCH:(j + 1) * BATCH])
            for j in (i % (len(IMAGES) // BATCH) for i in range(n))]


def mlp(images, extended=False, trainable=True):
    """The docs' MLP (dense1, dense2, and dense3 in the finetuned version)."""
    flat = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(flat, 16, activation=flow.nn.relu, name="dense1",
                               kernel_initializer=flow.truncated_normal(0.1),
                               trainable=trainable)
    logits = flow.layers.dense(hidden, 4, name="dense2",
                               kernel_initializer=flow.truncated_normal(0.1),
                               trainable=trainable)
    if extended:
        logits = flow.layers.dense(logits, 4, name="dense3",
                                   kernel_initializer=flow.constant_initializer(0.25))
    return logits


def define_train_job(extended=False):
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 6, 6)),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, mlp(images, extended)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss
    return train_job


def define_predict_job():
    @flow.global_function(type="predict")
    def predict_job(images: tp.Numpy.Placeholder((BATCH, 1, 6, 6))) -> tp.Numpy:
        return flow.nn.softmax(mlp(images, trainable=False))
    return predict_job


def train(job, steps, start=0):
    return [float(job(*b)) for b in batches(start + steps)[start:]]


# -- flow.train.CheckPoint ------------------------------------------------------------------

def test_checkpoint_cycle_resumes_exactly_serves_predictions_and_finetunes(tmp_path, capsys):
    flow.config.seed(3)
    train_job = define_train_job()
    uninterrupted = train(train_job, 6)
    flow.clear_default_session()

    flow.config.seed(3)
    train_job = define_train_job()
    check_point = flow.train.CheckPoint()
    check_point.init()                          # a no-op beside the session's own
    first = train(train_job, 3)
    check_point.save(str(tmp_path / "models_1"))
    saved = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    assert "deprecated" in capsys.readouterr().out
    assert first == uninterrupted[:3]
    assert (tmp_path / "models_1" / "snapshot_done").is_file()
    assert {"dense1-weight", "dense2-bias", "dense1-weight-momentum",
            "System-Train-TrainStep-train_job"} <= set(os.listdir(tmp_path / "models_1"))

    flow.clear_default_session()                # a new program resumes: same numbers
    flow.config.seed(99)                        # (another initialisation: load replaces it)
    train_job = define_train_job()
    flow.train.CheckPoint().load(str(tmp_path / "models_1"))
    assert train(train_job, 3, start=3) == uninterrupted[3:]
    with pytest.raises(AssertionError, match="Non-empty directory"):
        flow.train.CheckPoint().save(str(tmp_path / "models_1"))

    flow.clear_default_session()                # a predict program loads the training save
    predict_job = define_predict_job()
    flow.train.CheckPoint().load(str(tmp_path / "models_1"))
    images = batches(1)[0][0]
    hidden = np.maximum(images.reshape(BATCH, -1) @ saved["dense1-weight"].T
                        + saved["dense1-bias"], 0)
    logits = hidden @ saved["dense2-weight"].T + saved["dense2-bias"]
    expected = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(predict_job(images), expected, rtol=1e-5, atol=1e-6)

    flow.clear_default_session()                # finetuning: dense3 is not in the save
    train_job = define_train_job(extended=True)
    flow.train.CheckPoint().load(str(tmp_path / "models_1"))
    loaded = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    for name in ("dense1-weight", "dense1-bias", "dense2-weight", "dense2-bias"):
        np.testing.assert_array_equal(loaded[name], saved[name])
    np.testing.assert_array_equal(loaded["dense3-weight"], np.full((4, 4), 0.25, np.float32))
    losses = train(train_job, 8)
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    flow.train.CheckPoint().save(str(tmp_path / "ext_models_1"))
    assert "dense3-weight" in os.listdir(tmp_path / "ext_models_1")


def test_legacy_model_io_saves_and_loads_across_modes(tmp_path):
    flow.config.enable_legacy_model_io(True)
    try:
        train_job = define_train_job()
        check_point = flow.train.CheckPoint()
        check_point.init()
        train(train_job, 2)
        check_point.save(str(tmp_path / "legacy"))
        saved = flow.get_all_variables()["dense2-weight"].numpy()
    finally:
        flow.config.enable_legacy_model_io(False)
    flow.clear_default_session()
    define_predict_job()
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "legacy")))
    np.testing.assert_array_equal(flow.get_all_variables()["dense2-weight"].numpy(), saved)


def test_model_io_v2_leaves_legacy_model_io_on(capsys):
    """OneFlow-Benchmark's GPT: enable_legacy_model_io() then enable_model_io_v2(True),
    two fields of OneFlow's resource config; CheckPoint() is deprecated only without
    legacy model io (check_point.py)."""
    flow.config.enable_legacy_model_io()
    try:
        flow.config.enable_model_io_v2(True)
        assert flow.config.legacy_model_io_enabled()
        flow.train.CheckPoint()
        assert "deprecated" not in capsys.readouterr().out
    finally:
        flow.config.enable_legacy_model_io(False)
        flow.config.enable_model_io_v2(False)
    flow.train.CheckPoint()
    assert "'flow.train.CheckPoint' is deprecated" in capsys.readouterr().out


def test_simple_checkpoint_manager_initializes_then_restores_the_newest(tmp_path):
    root = str(tmp_path / "snapshots")
    train_job = define_train_job()
    manager = flow.train.SimpleCheckPointManager(root)
    manager.initialize_or_restore()             # nothing there: a first snapshot
    assert len(manager.list_checkpoints()) == 1
    train(train_job, 2)
    manager.save()
    newest = flow.get_all_variables()["dense1-weight"].numpy()
    assert manager.latest_checkpoint() == manager.list_checkpoints()[-1]

    flow.clear_default_session()
    flow.config.seed(42)
    define_train_job()
    manager = flow.train.SimpleCheckPointManager(root)
    manager.initialize_or_restore()
    np.testing.assert_array_equal(flow.get_all_variables()["dense1-weight"].numpy(), newest)
    assert len(manager.list_checkpoints()) == 2


# -- flow.Model.fit -------------------------------------------------------------------------

class Classifier(flow.Model):
    def __init__(self):
        super().__init__(is_deprecated_function_style=True)

    def forward(self, images):
        return mlp(images)

    def training_step(self, batch, optimizer_idx=0):
        images, labels = batch
        return flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, self(images)))

    def validation_step(self, batch):
        images, labels = batch
        return flow.math.argmax(self(images)), labels

    def configure_optimizers(self):
        return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                                  momentum=0.9)


class Batches(flow.model.NumpyDataModule):
    def forward(self, step_idx=0, optimizer_idx=0):
        return batches(step_idx + 1)[step_idx]


class Log(flow.model.Callback):
    def __init__(self):
        self.losses, self.accuracy = [], []

    def on_training_step_end(self, outputs, step_idx, optimizer_idx):
        loss = outputs.numpy()
        assert loss.shape == ()                 # OneFlow 0.5's full reduction
        self.losses.append(float(loss))
        print(f"step {step_idx}: loss {loss:.4f}")

    def on_validation_step_end(self, outputs, step_idx):
        predictions, labels = (o.numpy() for o in outputs)
        self.accuracy.append((step_idx, float(np.mean(predictions == labels))))


def test_model_fit_with_callbacks_checkpoints_and_a_resumed_fit(tmp_path, capsys):
    def configs(save=None, load=None):
        training, validation = flow.model.TrainingConfig(), flow.model.ValidationConfig()
        training.config_data(Batches())
        validation.config_data(Batches())
        validation.config_step_interval(4)
        checkpoint = flow.model.CheckpointConfig()
        if save:
            checkpoint.config_save(str(tmp_path / save), step_interval=4)
        if load:
            checkpoint.config_load(str(tmp_path / load))
        return dict(training_config=training, validation_config=validation,
                    checkpoint_config=checkpoint)

    flow.config.seed(5)
    whole = Log()
    Classifier().fit(**configs(), callbacks=[whole], max_steps=8)
    assert [step for step, _ in whole.accuracy] == [3, 7]
    assert all(0 <= acc <= 1 for _, acc in whole.accuracy)
    assert "step 7: loss" in capsys.readouterr().out

    flow.config.seed(5)
    first = Log()
    Classifier().fit(**configs(save="fit"), callbacks=first, max_steps=4)
    assert first.losses == whole.losses[:4]
    assert sorted(os.listdir(tmp_path)) == ["fit-3"]

    class Resumed(Batches):                     # the data goes on at step 4
        def forward(self, step_idx=0, optimizer_idx=0):
            return super().forward(step_idx + 4)

    flow.config.seed(11)
    resumed = Log()
    config = configs(load="fit-3")
    config["training_config"].config_data(Resumed())
    Classifier().fit(**config, callbacks=resumed, max_steps=4)
    np.testing.assert_allclose(resumed.losses, whole.losses[4:], rtol=1e-6)


# -- flow.saved_model and flow.serving -------------------------------------------------------

def test_trained_model_exported_and_served_gives_the_predict_jobs_numbers(tmp_path):
    train_job = define_train_job()
    train(train_job, 4)
    flow.checkpoint.save(str(tmp_path / "trained"))
    flow.clear_default_session()

    names = {}

    @flow.global_function(type="predict")
    def classify(images: tp.Numpy.Placeholder((BATCH, 1, 6, 6))) -> tp.Numpy:
        names["images"] = images.logical_blob_name
        probabilities = flow.nn.softmax(mlp(images, trainable=False))
        names["probabilities"] = probabilities.logical_blob_name
        return probabilities

    flow.load_variables(flow.checkpoint.get(str(tmp_path / "trained")))
    expected = [classify(images) for images, _ in batches(3)]
    builder = flow.saved_model.ModelBuilder(str(tmp_path / "saved"))
    builder.ModelName("mlp").Version(1).AddFunction(classify).AddSignature("classify") \
        .Input("images", names["images"]).Output("probabilities", names["probabilities"])
    builder.Save()
    flow.clear_default_session()

    session = flow.serving.InferenceSession()
    session.load_saved_model(str(tmp_path / "saved"))
    session.launch()
    job = session.list_jobs()[0]
    assert job == "classify"
    assert session.input_info("images", job) == {"shape": (BATCH, 1, 6, 6),
                                                 "dtype": flow.float32}
    assert session.output_info("probabilities", job)["dtype"] == flow.float32
    for (images, _), want in zip(batches(3), expected):
        (got,) = session.run(job, images=images)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    session.close()


# -- OFRecord datasets written with record_pb2 -----------------------------------------------

@pytest.fixture
def record_pb2():
    install_oneflow_alias()
    try:
        from oneflow.core.record import record_pb2
    finally:
        uninstall_oneflow_alias()
    return record_pb2


def write_part(path, records):
    """Append records as the docs' scripts do: a native int64 length, then the bytes."""
    with open(path, "ab") as f:
        for record in records:
            f.write(struct.pack("q", record.ByteSize()))
            f.write(record.SerializeToString())


def test_records_written_with_record_pb2_train_through_the_raw_decoders(tmp_path, record_pb2):
    def record(image, label):
        return record_pb2.OFRecord(feature={
            "images": record_pb2.Feature(float_list=record_pb2.FloatList(
                value=image.ravel().tolist())),
            "labels": record_pb2.Feature(int64_list=record_pb2.Int64List(value=[label]))})

    half = len(IMAGES) // 2
    for part, rows in enumerate((range(half), range(half, len(IMAGES)))):
        write_part(tmp_path / f"part-{part}", [record(IMAGES[i], LABELS[i]) for i in rows])

    @flow.global_function(type="train")
    def train_job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        records = flow.data.ofrecord_reader(str(tmp_path), batch_size=BATCH, data_part_num=2,
                                            part_name_suffix_length=-1)
        images = flow.data.OFRecordRawDecoder(records, "images", shape=(1, 6, 6),
                                              dtype=flow.float)
        labels = flow.data.OFRecordRawDecoder(records, "labels", shape=(), dtype=flow.int32)
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, mlp(images)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.2]),
                           momentum=0.9).minimize(loss)
        return images, labels, loss

    seen, losses = [], []
    for _ in range(12):
        images, labels, loss = train_job()
        seen.append((images, labels))
        losses.append(float(loss))
    for i, (images, labels) in enumerate(seen[:4]):  # in file order, part by part
        np.testing.assert_array_equal(images, IMAGES[i * BATCH:(i + 1) * BATCH])
        np.testing.assert_array_equal(labels, LABELS[i * BATCH:(i + 1) * BATCH])
    assert np.mean(losses[-3:]) < losses[0]


def test_image_records_written_with_record_pb2_decode_resize_and_normalize(tmp_path,
                                                                         record_pb2):
    # img2ofrecord.py's layout: PNG bytes under "images", an int32 label, five parts
    pixels = (RNG.random((10, 12, 10)) * 255).astype(np.uint8)
    labels = np.arange(10, dtype=np.int32) % 3

    def png(gray):
        buffer = io.BytesIO()
        Image.fromarray(gray).save(buffer, format="PNG")
        return buffer.getvalue()

    for i, (gray, label) in enumerate(zip(pixels, labels)):
        write_part(tmp_path / f"part-{i // 2}", [record_pb2.OFRecord(feature={
            "images": record_pb2.Feature(bytes_list=record_pb2.BytesList(value=[png(gray)])),
            "labels": record_pb2.Feature(int32_list=record_pb2.Int32List(value=[label]))})])

    @flow.global_function(type="train")
    def train_job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        records = flow.data.ofrecord_reader(str(tmp_path), batch_size=5, data_part_num=5,
                                            part_name_suffix_length=-1)
        image = flow.data.OFRecordImageDecoder(records, "images", color_space="GRAY")
        label = flow.data.OFRecordRawDecoder(records, "labels", shape=(1,), dtype=flow.int32)
        resized, _, _ = flow.image.Resize(image, target_size=(6, 6), channels=1)
        normal = flow.image.CropMirrorNormalize(resized, color_space="GRAY", mean=[0.0],
                                                std=[255.0], output_dtype=flow.float)
        logits = mlp(normal)
        # (N, 1) labels: OneFlow squeezes the last axis of labels of the logits' rank
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
            label, logits))
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.001])) \
            .minimize(loss)
        return normal, label, loss

    normal, label, loss = train_job()
    assert normal.shape == (5, 1, 6, 6) and loss.shape == ()
    np.testing.assert_array_equal(label, labels[:5, None])
    # flow.image.Resize's default interpolation (pinned against OpenCV in test_image_ops)
    want = [image_io.resize(g[:, :, None], 6, 6, "auto")[:, :, 0] / np.float32(255)
            for g in pixels[:5]]
    np.testing.assert_allclose(normal[:, 0], np.stack(want), rtol=1e-6)


def test_the_docs_image_pipeline_trains_from_shuffled_records(tmp_path, record_pb2):
    # of_data_pipeline.py / img_to_ofrecord's lenet_train.py: shuffled reading, a random
    # crop decoder, Resize by resize_x/resize_y or target_size, CoinFlip mirroring
    colors = (RNG.random((12, 9, 11, 3)) * 255).astype(np.uint8)

    def jpeg(rgb):
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, format="JPEG")
        return buffer.getvalue()

    write_part(tmp_path / "part-00000", [record_pb2.OFRecord(feature={
        "encoded": record_pb2.Feature(bytes_list=record_pb2.BytesList(value=[jpeg(rgb)])),
        "class/label": record_pb2.Feature(int32_list=record_pb2.Int32List(value=[i % 4]))})
        for i, rgb in enumerate(colors)])

    @flow.global_function(type="train")
    def train_job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        records = flow.data.ofrecord_reader(str(tmp_path), batch_size=4, data_part_num=1,
                                            part_name_suffix_length=5, random_shuffle=True,
                                            shuffle_after_epoch=True)
        image = flow.data.OFRecordImageDecoderRandomCrop(records, "encoded", color_space="RGB",
                                                         random_area=(0.95, 1.0),
                                                         random_aspect_ratio=(0.99, 1.0))
        label = flow.data.OFRecordRawDecoder(records, "class/label", shape=(),
                                             dtype=flow.int32)
        resized = flow.image.Resize(image, resize_x=6, resize_y=6, color_space="RGB")
        normal = flow.image.CropMirrorNormalize(
            resized, mirror_blob=flow.random.CoinFlip(batch_size=4), color_space="RGB",
            mean=[123.68, 116.779, 103.939], std=[58.393, 57.12, 57.375],
            output_dtype=flow.float)
        gray = flow.math.reduce_mean(normal, axis=[1], keepdims=True)
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
            label, mlp(gray)))
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])) \
            .minimize(loss)
        return normal, label, loss

    flow.config.seed(2)
    seen = []
    for _ in range(6):                          # two epochs
        normal, label, loss = train_job()
        assert normal.shape == (4, 3, 6, 6) and normal.dtype == np.float32
        assert np.isfinite(loss) and loss.shape == ()
        seen.extend(label.tolist())
    # OneFlow's shuffle buffer (1024 records of the endless stream) mixes the epochs
    assert set(seen) <= {0, 1, 2, 3} and seen[:12] != [i % 4 for i in range(12)]


# -- asynchronous loops ------------------------------------------------------------------

def test_an_async_training_loop_is_whole_before_a_checkpoint_is_saved(tmp_path):
    flow.config.seed(1)
    train_job = define_train_job()
    train(train_job, 5)
    synchronous = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    flow.clear_default_session()

    flow.config.seed(1)
    losses = []

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 6, 6)),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)
                  ) -> tp.Callback[tp.Numpy]:
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, mlp(images)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss

    for images, labels in batches(5):
        train_job(images, labels)(lambda loss: losses.append(float(loss)))
    flow.checkpoint.save(str(tmp_path / "async"))  # waits for the five steps
    assert len(losses) == 5
    saved = flow.checkpoint.get(str(tmp_path / "async"))
    assert set(saved) == set(synchronous)
    for name, value in synchronous.items():
        np.testing.assert_array_equal(saved[name].numpy(), value, err_msg=name)


def test_checkpoint_targets_and_subsets_as_documented(tmp_path):
    define_train_job()
    (tmp_path / "empty").mkdir()
    flow.checkpoint.save(str(tmp_path / "empty"))   # an empty folder is a valid target
    variables = flow.get_all_variables()
    flow.checkpoint.save(str(tmp_path / "deep" / "dense1"),
                         {"dense1-weight": variables["dense1-weight"]})
    assert sorted(os.listdir(tmp_path / "deep" / "dense1")) == ["dense1-weight",
                                                                "snapshot_done"]
    single = flow.checkpoint.get(str(tmp_path / "deep" / "dense1" / "dense1-weight"))
    np.testing.assert_array_equal(single.numpy(), variables["dense1-weight"].numpy())
    with pytest.raises(RuntimeError, match="is not a variable name"):
        flow.load_variables({"no-such-variable": np.zeros(1, np.float32)},
                            ignore_mismatch=False)
    flow.load_variables({"no-such-variable": np.zeros(1, np.float32),
                         "dense2-bias": np.ones(4, np.float32)})
    np.testing.assert_array_equal(flow.get_all_variables()["dense2-bias"].numpy(), np.ones(4))
