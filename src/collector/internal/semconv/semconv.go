// Package semconv holds the names that cross skewtrace's component boundaries. It must match
// docs/semantic-conventions.md, which is the source of truth (semconv_test.go checks it).
package semconv

// Resource attributes, one resource per rank process.
const (
	AttrServiceName       = "service.name"
	AttrServiceInstanceID = "service.instance.id"
	AttrJobID             = "training.job.id"
	AttrRank              = "training.rank"
	AttrLocalRank         = "training.local_rank"
	AttrWorldSize         = "training.world_size"
	AttrHostName          = "host.name"
	AttrSwitch            = "training.switch"
	AttrNIC               = "training.nic"
)

// Span names.
const (
	SpanStepRoot         = "train.step.root"
	SpanStep             = "train.step"
	SpanDataloaderFetch  = "dataloader.fetch"
	SpanForward          = "forward"
	SpanBackward         = "backward"
	SpanOptimizerStep    = "optimizer.step"
	SpanPacingDelay      = "pacing.delay"
	SpanCollectivePrefix = "collective."
)

// Span attributes set by the instrumentation.
const (
	AttrStep             = "training.step"
	AttrCollectiveOp     = "training.collective.op"
	AttrCollectivePG     = "training.collective.pg"
	AttrCollectivePGSize = "training.collective.pg_size"
	AttrCollectiveSeq    = "training.collective.seq"
	AttrCollectiveBytes  = "training.collective.bytes"
	AttrCollectiveAsync  = "training.collective.async"
	AttrCollectiveSource = "training.collective.source"
	AttrTiming           = "training.timing"
)

// DefaultPG is the process group name of the world group.
const DefaultPG = "default"

// Annotations the barrierskew processor adds to collective spans.
const (
	AttrBarrierSkew         = "training.barrier.skew"
	AttrBarrierLateness     = "training.barrier.lateness"
	AttrBarrierWait         = "training.barrier.wait"
	AttrBarrierTransfer     = "training.barrier.transfer"
	AttrClockOffset         = "training.clock.offset"
	AttrStraggler           = "training.straggler"
	AttrStragglerCause      = "training.straggler.cause"
	AttrStragglerDomain     = "training.straggler.domain"
	AttrBarrierMissingRanks = "training.barrier.missing_ranks"
	AttrBarrierMissing      = "training.barrier.missing"
)

// Values of training.straggler.cause.
const (
	CauseData    = "data"
	CauseCompute = "compute"
	CauseNetwork = "network"
	CauseUnknown = "unknown"
)

// UnknownTopology is the value of training.switch / training.nic when not known.
const UnknownTopology = "unknown"

// Metrics emitted by the barrierskew connector.
const (
	MetricBarrierSkew          = "training.barrier.skew"
	MetricRankLateness         = "training.rank.lateness"
	MetricRankWait             = "training.rank.wait"
	MetricStraggler            = "training.straggler"
	MetricStragglerDomain      = "training.straggler.domain"
	MetricCollectiveIncomplete = "training.collective.incomplete"
	MetricRankMissing          = "training.rank.missing"
	MetricClockOffset          = "training.clock.offset"
	MetricStepDuration         = "training.step.duration"
)
