"""`flow.train.SimpleCheckPointManager`: timestamped snapshots under one root directory
(OneFlow's framework/check_point.py, over flow.checkpoint.save / get)."""
import datetime
import os

from onnxjob.io import checkpoint


class SimpleCheckPointManager:
    """Snapshots `root_path/<prefix><%Y%m%d_%H%M%S_%f>`, each a flow.checkpoint.save of
    every variable; a snapshot counts once its `snapshot_done` file exists."""

    def __init__(self, root_path, prefix="snapshot_"):
        if not os.path.exists(root_path):
            os.makedirs(root_path)
        else:
            assert os.path.isdir(root_path)
        self._root_path = root_path
        self._prefix = prefix

    def list_checkpoints(self):
        """The names of the complete snapshots, oldest first (names sort by time)."""
        def is_snapshot(name):
            if not name.startswith(self._prefix):
                return False
            done = os.path.join(self._GetSnapshotPath(name), "snapshot_done")
            return os.path.isfile(done)
        return sorted(f for f in os.listdir(self._root_path) if is_snapshot(f))

    def latest_checkpoint(self):
        """The newest snapshot's name, or None."""
        names = self.list_checkpoints()
        return names[-1] if names else None

    def initialize_or_restore(self):
        """Load the newest snapshot into the variables, or save a first one if none."""
        name = self.latest_checkpoint()
        if name:
            checkpoint.load_variables(checkpoint.get(self._GetSnapshotPath(name)))
        else:
            self.save()

    def save(self):
        """Save every variable as a new snapshot."""
        checkpoint.save(self._GetSnapshotPath(self._NextSnapshotName()))

    def _NextSnapshotName(self):
        return self._prefix + datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f")

    def _GetSnapshotPath(self, name):
        return os.path.join(self._root_path, name)
