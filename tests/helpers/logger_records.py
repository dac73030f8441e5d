"""What a run logged to TensorBoard, read back with TensorBoard's plugin event accumulator (the one
its backend serves the dashboards from, purging what a restarted writer replaced). MLflow's store
is read by tests/helpers/mlflow_reader.py, in a process of its own."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from tensorboard.util import tensor_util


class TensorBoardLog:
    def __init__(self, log_dir: Path) -> None:
        self.events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})  # 0: keep every point
        self.events.Reload()

    def tags(self) -> list[str]:
        return self.events.Tags()["tensors"]

    def scalars(self, tag: str) -> list[tuple[int, float]]:
        """(step, value) of a scalar, in the order logged."""
        return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in self.events.Tensors(tag)]

    def texts(self, tag: str) -> list[tuple[int, str]]:
        """(step, text) of what SummaryWriter.add_text logged under `tag`."""
        return [
            (e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
            for e in self.events.Tensors(f"{tag}/text_summary")
        ]

    def hparams(self) -> tuple[dict, list[str], str]:
        """The HParams dashboard's session: {name: value}, the metric tags, the end status."""
        content = {
            tag: HParamsPluginData.FromString(data) for tag, data in self.events.PluginTagToContent("hparams").items()
        }
        start = content["_hparams_/session_start_info"].session_start_info
        values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
        metrics = [m.name.tag for m in content["_hparams_/experiment"].experiment.metric_infos]
        status = api_pb2.Status.Name(content["_hparams_/session_end_info"].session_end_info.status)
        return values, metrics, status
