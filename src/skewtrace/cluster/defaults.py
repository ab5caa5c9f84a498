"""What ``skewtrace demo`` runs unless told otherwise: the package's collector configs and
training script (paths in the checkout's layout, :mod:`skewtrace._resources` finds them), and
the faults injected on the fabric and on loopback. Read by the demo's command line
(:mod:`skewtrace.cluster.command`, for its help) and by the demo (:mod:`skewtrace.cluster.demo`);
neither imports the other's module for them."""

from __future__ import annotations

COLLECTOR_CONFIG = "collector-config/otelcol.yaml"
FILE_EXPORT_CONFIG = "collector-config/file-export.yaml"
EXAMPLE = "examples/train_2d.py"
DEFAULT_FABRIC_SCENARIO = "nic:node2:200@15:45"
DEFAULT_LOOPBACK_SCENARIO = "compute:2:0.04@10"
