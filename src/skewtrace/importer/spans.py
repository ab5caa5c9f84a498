"""Imported events -> the spans a live rank would have sent, built by the live path's code.

Each (job, rank) gets the resource keys a rank process has (:mod:`skewtrace.rank.resource`'s
keys: ``service.name``, ``service.instance.id``, ``training.job.id``, ``training.rank``,
``training.local_rank``, ``training.world_size``, ``host.name``, ``training.switch``,
``training.nic``; an imported what-if worker also ``training.worker.first_gpu``,
``training.worker.gpus``, ``training.pipeline.stage`` and ``training.dp_rank``), with the
values the input gave instead of the local machine's, and its events go through the ranks'
own :class:`~skewtrace.rank._export.materialize.SpanMaterializer`: trace ID and step root from
(job, step), each rank's ``train.step`` ID from (job, step, rank), the step's other spans its
children, rank 0 emitting ``train.step.root``. Times are already epoch nanoseconds, so the
materializer's anchor is 0.
"""

from __future__ import annotations

from collections import defaultdict

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from skewtrace import semconv
from skewtrace.importer.model import ImportedJob, RankInput, local_ranks
from skewtrace.rank._export.materialize import Identity, SpanMaterializer


def rank_resource(rank: RankInput, local_rank: int) -> Resource:
    """The rank's resource, as :func:`skewtrace.rank.resource.build_resource` makes it
    (``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` honored; the training keys win)."""
    attributes: dict[str, str | int] = {
        **rank.attributes,
        semconv.SERVICE_INSTANCE_ID: f"{rank.job}/{rank.rank}",
        semconv.JOB_ID: rank.job,
        semconv.RANK: rank.rank,
        semconv.LOCAL_RANK: local_rank,
        semconv.WORLD_SIZE: rank.world_size,
        semconv.HOST_NAME: rank.host,
        semconv.SWITCH: rank.switch,
        semconv.NIC: rank.nic,
    }
    resource = Resource.create(attributes)
    service = str(resource.attributes.get(semconv.SERVICE_NAME, ""))
    if not service or service.startswith("unknown_service"):
        resource = resource.merge(Resource({semconv.SERVICE_NAME: semconv.DEFAULT_SERVICE_NAME}))
    return resource


def spans_by_step(job: ImportedJob) -> dict[tuple[str, int], list[ReadableSpan]]:
    """Every span, grouped by (job, step) (sent in that order, as the ranks send them)."""
    positions = local_ranks(job.ranks.values())
    out: dict[tuple[str, int], list[ReadableSpan]] = defaultdict(list)
    for key, rank in sorted(job.ranks.items()):
        identity = Identity(rank.job, rank.rank, rank_resource(rank, positions[key]))
        materializer = SpanMaterializer(identity, epoch_anchor_ns=0)
        events = sorted(rank.events, key=lambda event: (event.step, event.start_ns))
        for span in materializer.materialize(events, final=True):
            step = int((span.attributes or {})[semconv.STEP])  # type: ignore[arg-type]
            out[(rank.job, step)].append(span)
    return dict(sorted(out.items()))
