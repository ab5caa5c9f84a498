// Package join is the barrierskew join engine: it joins the spans of one collective across
// ranks, keyed by (job, process group, sequence number), and turns the members' durations
// into skew, lateness, wait, transfer and clock offsets. Every released collective also goes
// to the step analysis (internal/diagnosis), whose flags give the members their verdicts.
//
// It knows nothing about pdata: the components translate spans into Arrival and Phase values
// and carry their own per-span handle in the generic Ref. The clock is injected. The engine
// is not safe for concurrent use; each component guards it with one mutex.
//
//	Arrival ──Add──▶ pending[(job, pg, seq)] ──all pg_size members──▶ Released (complete)
//	                      │  wait_timeout (Expire) / max_pending, max_buffered_spans (evict)
//	                      └──────────────────────────────────────────▶ Released (incomplete)
//	Released ──▶ diagnosis: open step (job, step) ──Analyze──▶ StepResult, flags
//	Phase ──AddPhase──▶ diagnosis phase cache ──read at analysis──▶ cause
package join

import (
	"time"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

// Clock gives the engine its notion of now (a fake clock in tests).
type Clock interface {
	Now() time.Time
}

// Key identifies one collective call of one job. A point-to-point message's PG carries
// the pair and direction (see spanio), so its sender and receiver join like a two-member
// collective.
type Key struct {
	Job string
	PG  string
	Seq int64
}

// Topology is where a rank runs.
type Topology = diagnosis.Topology

// Arrival is one rank's span of a collective.
type Arrival[R any] struct {
	Key
	Op     string
	PGSize int
	Step   int64
	Rank   int
	// WorldSize is the job's world size from the rank's resource, 0 when unknown.
	WorldSize int
	Topology
	StartUnixNano int64
	EndUnixNano   int64
	Bytes         int64
	Async         bool
	// P2P marks a point-to-point message; Role says which side this span is.
	P2P  bool
	Role diagnosis.Role
	// Ref is the component's handle to the span (annotated after release).
	Ref R
}

// Verdict is the straggler annotation of one member after a release.
type Verdict uint8

const (
	// VerdictUnchanged: the rank is flagged but was not the late one in this collective;
	// the span gets no training.straggler attribute.
	VerdictUnchanged Verdict = iota
	// VerdictClear: the rank is not flagged (training.straggler=false).
	VerdictClear
	// VerdictStraggler: the rank is flagged and was the late one (training.straggler=true).
	VerdictStraggler
)

// Member is one arrived rank of a released collective with its computed figures.
type Member[R any] struct {
	diagnosis.Span
	// Duration of the rank's span in seconds.
	Duration float64
	// Lateness is max(duration) - duration: how much later than the earliest it arrived.
	Lateness float64
	// Wait is duration - min(duration): how long it waited for the last arrival.
	Wait float64
	// ClockOffset is the host's end timestamp minus the members' median end timestamp.
	ClockOffset float64
	// Verdict, Cause and Domain come from the job's flags (the step analysis of earlier
	// steps): Cause and Domain are set with VerdictStraggler (Domain may be empty).
	Verdict Verdict
	Cause   string
	Domain  string
	Ref     R
}

// CountsAsMissing reports whether an incomplete collective released for this reason is
// evidence that its missing members never arrived (their ranks counted missing): only a
// timeout is; an eviction (a memory bound), a shutdown or a partial release after a start
// is not.
func (r ReleaseReason) CountsAsMissing() bool { return r == ReleasedTimeout }

// ReleaseReason says why a collective left the pending set.
type ReleaseReason uint8

const (
	// ReleasedComplete: every member arrived.
	ReleasedComplete ReleaseReason = iota
	// ReleasedTimeout: wait_timeout passed since the first arrival.
	ReleasedTimeout
	// ReleasedEvicted: max_pending or max_buffered_spans forced out the oldest.
	ReleasedEvicted
	// ReleasedShutdown: the component is stopping.
	ReleasedShutdown
	// ReleasedPartial: wait_timeout (and max_wait) passed for a collective that began within
	// startup_grace: its missing members may have gone to the instance before a restart, so
	// it is not evidence of a missing rank.
	ReleasedPartial
)

func (r ReleaseReason) String() string {
	switch r {
	case ReleasedComplete:
		return "complete"
	case ReleasedTimeout:
		return semconv.ReleasedTimeout
	case ReleasedEvicted:
		return semconv.ReleasedEvicted
	case ReleasedPartial:
		return semconv.ReleasedPartial
	default:
		return semconv.ReleasedShutdown
	}
}

// Released is a collective leaving the engine, with its members annotated.
type Released[R any] struct {
	Key
	Op     string
	Step   int64
	PGSize int
	Reason ReleaseReason
	// Members in arrival order.
	Members []Member[R]
	// Skew is max(duration) - min(duration) in seconds.
	Skew float64
	// Transfer is min(duration): the part after the last arrival.
	Transfer float64
	// Slowdown is Transfer over its reference from the job's history (0 while unknown).
	Slowdown float64
	P2P      bool
	// MissingRanks is how many members never arrived (0 when complete).
	MissingRanks int
	// Missing names the missing ranks as far as they are known (may be shorter than
	// MissingRanks, or empty).
	Missing []int
}

// Complete reports whether every member arrived.
func (r *Released[R]) Complete() bool { return r.MissingRanks == 0 }

// Phase is one rank's phase span (its own clock).
type Phase struct {
	Job           string
	Step          int64
	Rank          int
	Kind          diagnosis.PhaseKind
	StartUnixNano int64
	EndUnixNano   int64
	// InputSize is a forward span's training.input.size (0: not given).
	InputSize int64
	// WorldSize is the job's world size from the rank's resource, 0 when unknown.
	WorldSize int
}

// Outcome is what Add did with an arrival.
type Outcome uint8

const (
	// Accepted: the arrival is buffered (or completed its collective).
	Accepted Outcome = iota
	// RejectedDuplicate: the rank already arrived for this (job, pg, seq).
	RejectedDuplicate
	// RejectedRankOutOfGroup: the rank is negative, not below the world size, or not below
	// pg_size in the default group.
	RejectedRankOutOfGroup
	// RejectedPGSizeMismatch: pg_size differs from the first arrival's, is < 1, or exceeds
	// the world size.
	RejectedPGSizeMismatch
	// RejectedBadDuration: end < start.
	RejectedBadDuration
	// RejectedLate: the collective was already released.
	RejectedLate
)

// Reason is the metric label of a rejected arrival.
func (o Outcome) Reason() string {
	switch o {
	case RejectedDuplicate:
		return "duplicate"
	case RejectedRankOutOfGroup:
		return "rank_outside_group"
	case RejectedPGSizeMismatch:
		return "pg_size_mismatch"
	case RejectedBadDuration:
		return "bad_duration"
	case RejectedLate:
		return "late_arrival"
	default:
		return ""
	}
}

// Stats are the engine's own counters, read by the components' telemetry callbacks.
type Stats struct {
	Pending          int
	BufferedSpans    int
	Accepted         int64
	ReleasedComplete int64
	// ReleasedIncomplete counts timeouts, evictions and shutdown releases with members missing.
	ReleasedIncomplete int64
	Evicted            int64
	// Extended counts deadlines moved because a collective's missing members were alive
	// (or the component had just started).
	Extended int64
	Rejected [RejectedLate + 1]int64
	// Analysis are the step analysis' counters.
	Analysis diagnosis.Stats
}
