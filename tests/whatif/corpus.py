"""The corpus: named what-if jobs, each with what the oracle should name (a comment above it).

Workers are numbered ``w = stage * dp + dp_rank``. Generating and analyzing all of them takes
well under a minute on one core (``tests/test_whatif_oracle.py`` plays every one).
"""

from __future__ import annotations

from .generate import (
    HeavyStage,
    HostWork,
    JobSpec,
    Layers,
    SequenceImbalance,
    SlowDataLoader,
    SlowLink,
    SlowWorker,
    TokenLengths,
)

_HEADED = (1.0,) * 16 + (1.6,)
"""16 equal layers and a loss head of 1.6 layers: 4 layers a stage puts 5.6 on the last (1.4x)."""

_JOBS = (
    # Nothing wrong: slowdown within a few percent of 1, nothing named.
    JobSpec("healthy-1f1b", dp=4, pp=4, microbatches=8, seed=1),
    # Nothing wrong, interleaved (2 chunks) with eager p2p: nothing named.
    JobSpec("healthy-interleaved-eager", dp=2, pp=4, chunks=2, microbatches=8, p2p="eager", seed=2),
    # A slow GPU on stage 0 (worker 2): worker 2, compute; no stage, no data.
    JobSpec(
        "slow-worker-stage0",
        dp=4,
        pp=4,
        microbatches=8,
        seed=3,
        causes=(SlowWorker(stage=0, dp_rank=2, factor=1.4),),
    ),
    # A slow GPU in a middle stage of an interleaved job (worker 2*4+1 = 9): worker 9, compute.
    JobSpec(
        "slow-worker-middle-interleaved",
        dp=4,
        pp=4,
        chunks=2,
        microbatches=8,
        seed=4,
        causes=(SlowWorker(stage=2, dp_rank=1, factor=1.5),),
    ),
    # The last stage (the loss, the logits) computes 1.5x / 1.4x: stage 3, no worker.
    JobSpec(
        "heavy-last-stage",
        dp=8,
        pp=4,
        microbatches=8,
        seed=5,
        causes=(HeavyStage(stage=3, forward_factor=1.5, backward_factor=1.4),),
    ),
    # Two stages, the second with too many layers (1.6x), eager p2p: stage 1, no worker.
    JobSpec(
        "heavy-stage-2stage",
        dp=8,
        pp=2,
        microbatches=8,
        p2p="eager",
        seed=6,
        causes=(HeavyStage(stage=1, forward_factor=1.6, backward_factor=1.6),),
    ),
    # Long-tailed sequence lengths (a different slowest replica most steps): data, no stage.
    JobSpec(
        "sequence-imbalance",
        dp=16,
        pp=4,
        microbatches=8,
        seed=7,
        causes=(SequenceImbalance(),),
    ),
    # 2 stages x 32 replicas, stage 1 computing 1.6x / 1.7x, long-tailed lengths: stage 1 and
    # data.
    JobSpec(
        "heavy-stage-sequence-imbalance",
        dp=32,
        pp=2,
        microbatches=8,
        steps=8,
        seed=8,
        causes=(
            HeavyStage(stage=1, forward_factor=1.6, backward_factor=1.7),
            SequenceImbalance(),
        ),
    ),
    # A slow NIC (5x) on worker 1*2+0 = 2: worker 2, network.
    JobSpec(
        "slow-link",
        dp=2,
        pp=4,
        microbatches=8,
        seed=9,
        causes=(SlowLink(stage=1, dp_rank=0, factor=5.0),),
    ),
    # A slow NIC (4x) on worker 2*4+3 = 11, interleaved, eager p2p: worker 11, network.
    JobSpec(
        "slow-link-interleaved-eager",
        dp=4,
        pp=4,
        chunks=2,
        microbatches=8,
        p2p="eager",
        seed=10,
        causes=(SlowLink(stage=2, dp_rank=3, factor=4.0),),
    ),
    # Replica 1's data loader takes 4 ms more per microbatch: worker 1, data.
    JobSpec(
        "slow-dataloader",
        dp=4,
        pp=2,
        microbatches=8,
        seed=11,
        causes=(SlowDataLoader(dp_rank=1, seconds=0.004),),
    ),
    # 30 ms of Python before worker 2*4+3 = 11's first forward of each step: worker 11,
    # host_work.
    JobSpec(
        "host-work",
        dp=4,
        pp=4,
        microbatches=8,
        seed=12,
        causes=(HostWork(stage=2, dp_rank=3, seconds=0.03),),
    ),
    # Worker 1*4+0 = 4 turns slow (1.5x) at step 6 of 12: nothing named in steps 0-5, worker 4
    # (compute) from step 6.
    JobSpec(
        "late-slow-worker",
        dp=4,
        pp=4,
        microbatches=8,
        steps=12,
        seed=13,
        causes=(SlowWorker(stage=1, dp_rank=0, factor=1.5, first_step=6),),
    ),
    # 256 workers (64 replicas x 4 stages), 4 microbatches, one slow GPU: worker 3*64+40 =
    # 232, compute.
    JobSpec(
        "wide-256-slow-worker",
        dp=64,
        pp=4,
        microbatches=4,
        steps=8,
        seed=14,
        causes=(SlowWorker(stage=3, dp_rank=40, factor=1.5),),
    ),
    # 64 microbatches on 4 workers, interleaved, eager p2p, one slow GPU (1.3x): worker
    # 1*2+1 = 3, compute.
    JobSpec(
        "many-microbatches-slow-worker",
        dp=2,
        pp=2,
        chunks=2,
        microbatches=64,
        p2p="eager",
        steps=8,
        seed=15,
        causes=(SlowWorker(stage=1, dp_rank=1, factor=1.3),),
    ),
    # Two faults one after the other, 8 stages interleaved: worker 2*2+0 = 4 slow (1.5x) in
    # steps 0-3, then worker 6*2+1 = 13's NIC 5x: worker 4 (compute) in steps 0-3, worker 13
    # (network) in steps 4-7. (Both at once in different replicas, the slower replica hides
    # the other: fixing either alone leaves the other the bottleneck.)
    JobSpec(
        "deep-slow-worker-then-link",
        dp=2,
        pp=8,
        chunks=2,
        microbatches=16,
        steps=8,
        seed=16,
        causes=(
            SlowWorker(stage=2, dp_rank=0, factor=1.5, last_step=3),
            SlowLink(stage=6, dp_rank=1, factor=5.0, first_step=4),
        ),
    ),
)

_REMEDY_JOBS = (
    # Imbalances with a remedy (issue 46): generated again by whatif.generate.with_remedy,
    # their realized saving beside the verdict's price (benchmarks/remedies.py).
    # Real token lengths (log-normal, median 512, sigma 1.0, clipped to 16..8192; cost
    # t + t^2/2048), 256 samples a step in 4 replicas x 8 micro-batches of 8 by equal counts:
    # data, no stage.
    JobSpec(
        "tokens-dp4-pp4",
        dp=4,
        pp=4,
        microbatches=8,
        seed=17,
        causes=(TokenLengths(samples=256),),
    ),
    # The same lengths at 8 replicas x 4 stages, 512 samples a step: data, no stage.
    JobSpec(
        "tokens-dp8-pp4",
        dp=8,
        pp=4,
        microbatches=8,
        seed=18,
        causes=(TokenLengths(samples=512),),
    ),
    # 16 equal layers, 4 a stage, and a loss head on the last (1.4x the others): stage 3.
    JobSpec(
        "layers-heavy-last",
        dp=4,
        pp=4,
        microbatches=8,
        seed=19,
        causes=(Layers(costs=_HEADED, partition=(4, 4, 4, 5)),),
    ),
    # 8 equal layers over 2 stages, 4 each, and the head on the second (1.4x): stage 1.
    JobSpec(
        "layers-heavy-2stage",
        dp=4,
        pp=2,
        microbatches=8,
        seed=20,
        causes=(Layers(costs=(1.0,) * 8 + (1.6,), partition=(4, 5)),),
    ),
)

CORPUS: dict[str, JobSpec] = {spec.name: spec for spec in _JOBS + _REMEDY_JOBS}
