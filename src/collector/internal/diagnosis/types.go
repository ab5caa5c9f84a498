// Package diagnosis finds the root cause of each training step's delay: the ranks whose own
// work (data loading, compute) or whose link made the step late, the slow links located by
// set logic over process groups, and what each of them cost (what-if). It is pure: the join
// engine feeds it released collectives and phase spans, the clock is the caller's.
//
//	released collective ──ObserveCollective──▶ open step (job, step) ─┐
//	phase span ──ObservePhase──▶ phase cache[(job, step, rank)]       │ no collective of the
//	                                                                  │ step pending, and
//	                                                                  ▼ analysis_delay passed
//	                                      Close ──▶ step model ──▶ root causes, suspects, costs
//	                                                                  │
//	                                       flags (K of W steps, hysteresis) ◀─┘ ──▶ StepResult
//
// The step model. Each rank's spans in a step are ordered on its own clock; the time between
// a rank becoming free (the end of the span it waited for, or the launch of its previous
// asynchronous one) and its next launch is its own work, a "gap" measured on one clock. A
// collective ends at max(arrival) + transfer on every member, so replaying the step from the
// gaps and transfers reproduces it on a virtual timeline that no host clock enters. Replaying
// it again with one rank's gaps at its peers' medians, or one link's transfers at their
// reference, says what that rank or link cost the step. A rank that only waited for another
// in one group and so arrived late to the next has ordinary gaps: it costs nothing and is
// never blamed.
package diagnosis

import "github.com/skewtrace/skewtrace/src/collector/internal/semconv"

// Topology is where a rank runs.
type Topology struct {
	Host   string
	Switch string
	NIC    string
}

// Role says what a member's span was in its collective.
type Role uint8

const (
	// RoleCollective: a member of a collective (all members end together).
	RoleCollective Role = iota
	// RoleSend: the sending side of a point-to-point message (it does not wait for the
	// receiver).
	RoleSend
	// RoleRecv: the receiving side of a point-to-point message (it ends when the message
	// has arrived).
	RoleRecv
)

// Span is one rank's span of one released collective.
type Span struct {
	Rank int
	Topology
	StartUnixNano int64
	EndUnixNano   int64
	Async         bool
	Role          Role
}

// Collective describes a released collective to ObserveCollective.
type Collective struct {
	Job    string
	PG     string
	Seq    int64
	Step   int64
	Op     string
	Bytes  int64
	PGSize int
	// P2P marks a point-to-point message (a send and its recv).
	P2P bool
	// Missing names the members that never arrived (empty when complete).
	Missing []int
	// MissingRanks counts them (Missing may name fewer).
	MissingRanks int
}

// PhaseKind is a phase span the analysis uses for causes.
type PhaseKind uint8

const (
	// PhaseStep is train.step: the rank's iteration.
	PhaseStep PhaseKind = iota
	// PhaseFetch is dataloader.fetch.
	PhaseFetch
	// PhaseForward is forward.
	PhaseForward
	// PhaseBackward is backward.
	PhaseBackward
	// PhaseOptimizer is optimizer.step.
	PhaseOptimizer
	// PhaseDelay is pacing.delay: time the pacer held the rank on purpose, not its work.
	PhaseDelay
	// NumPhaseKinds counts the kinds.
	NumPhaseKinds
)

// SuspectKind says what part of the fabric a suspect is.
type SuspectKind uint8

const (
	// SuspectNIC is a NIC of one host (named with its host).
	SuspectNIC SuspectKind = iota
	// SuspectHost is a host (its NICs unknown, or all of them implicated; or several
	// flagged ranks on it).
	SuspectHost
	// SuspectUplink is the uplink of a leaf switch: the groups that cross it are slow, the
	// groups inside it are not.
	SuspectUplink
	// SuspectSwitch is a leaf switch: the groups that touch it are slow, or flagged ranks
	// on two or more of its hosts share it.
	SuspectSwitch
)

func (k SuspectKind) String() string {
	switch k {
	case SuspectNIC:
		return "nic"
	case SuspectHost:
		return "host"
	case SuspectUplink:
		return "uplink"
	default:
		return "switch"
	}
}

// Suspect names a part of the fabric.
type Suspect struct {
	Kind SuspectKind
	// Name is the NIC, host or switch name.
	Name string
	// Host is the NIC's host (only for SuspectNIC).
	Host string
}

// ID is the suspect's stable text form: "nic:host/nic", "host:h", "uplink:s", "switch:s".
// It is also the value of training.straggler.domain.
func (s Suspect) ID() string {
	if s.Kind == SuspectNIC {
		return "nic:" + s.Host + "/" + s.Name
	}
	return s.Kind.String() + ":" + s.Name
}

// RootCause is one contributor to one step's delay.
type RootCause struct {
	// Rank is the root-cause rank; -1 for a link.
	Rank int
	Topology
	// Cause is data, compute, host_work, network or unknown (for a link: network).
	Cause string
	// Before is, for host_work, the span the rank's own time outside every phase preceded
	// (where in the step it sat).
	Before string
	// Cost is how much shorter the step would have been with this contributor at its
	// reference alone (its gaps at its peers' medians, or the link's transfers at their
	// reference), in seconds.
	Cost float64
	// Suspect is set for a link, and for a rank whose cause is its own link.
	Suspect *Suspect
	// Stage is the pipeline stage of a stage_imbalance (-1 otherwise). Ranks are the stage's
	// ranks; for a data_imbalance, the step's slowest replica (one rank), which the flags read
	// to tell the data from a persistent straggler.
	Stage int
	Ranks []int
	// Excess is an imbalance's work over balanced, minus 1; Fix says what to change.
	Excess float64
	Fix    string
	// Partition is a stage_imbalance's advised partition of the layers, when every stage
	// sent a layer profile (nil otherwise).
	Partition *Partition
}

// ImbalanceFlag is a flagged imbalance of a job: a pipeline stage longer than the mean
// stage, or work that varies across data-parallel replicas with no persistent rank.
type ImbalanceFlag struct {
	// Cause is stage_imbalance or data_imbalance.
	Cause string
	// Stage and Ranks name the stage (-1 and nil for data).
	Stage int
	Ranks []int
	// Excess is the latest step's work over balanced, minus 1.
	Excess float64
	// Cost is the seconds per step it has cost recently (moving average over the window).
	Cost float64
	// Fix says what to change.
	Fix string
	// Partition is the advised partition of a stage_imbalance (nil without layer profiles).
	Partition *Partition
}

// Saving is what fixing one kind of work alone would save in a step: the step replayed with
// every instance of that kind at its reference and everything else as measured.
type Saving struct {
	// Kind is semconv.AttributionCompute (the ranks' own work between collectives) or a
	// collective op (semconv.OpSendRecv for point-to-point messages).
	Kind string
	// Saves is how much shorter the replayed step is, in seconds.
	Saves float64
}

// RankFlag is a flagged rank's verdict.
type RankFlag struct {
	Rank int
	Topology
	Cause string
	// Before is, for host_work, where its own time sat in its latest step named so.
	Before string
	// Cost is the seconds per step it has cost recently (a moving average over the flag
	// window, counting 0 for steps it was not a root cause).
	Cost float64
	// Domain is the suspect's ID the rank belongs to ("" when none).
	Domain string
}

// SuspectFlag is a flagged suspect's verdict.
type SuspectFlag struct {
	Suspect
	// Cost is the seconds per step it has cost recently (moving average).
	Cost float64
	// Derived marks a suspect named because flagged ranks share it (a switch or host), not
	// because transfers located it.
	Derived bool
}

// StepResult is the analysis of one step of one job.
type StepResult struct {
	Job  string
	Step int64
	// Duration is the job's step time on the virtual timeline: from the latest rank
	// becoming free after the previous step to the latest rank finishing its collectives
	// in this one, in seconds.
	Duration float64
	// WhatIf is the duration with this step's root causes at their references.
	WhatIf float64
	// Ranks is how many ranks had spans in the step.
	Ranks int
	// World is the job's world size (0 when its spans did not say); Absent counts the ranks
	// of the world that had not ended the step when it was analyzed (step_timeout passed, or
	// a bound forced it), AbsentRanks names the first of them.
	World       int
	Absent      int
	AbsentRanks []int
	// Collectives is how many collectives the step had; SlowCollectives how many of them
	// had a slow transfer.
	Collectives     int
	SlowCollectives int
	// MinSaving is the least a rank or a link had to save in this step to be named a root
	// cause (min_cost, min_cost_fraction of the step, twice the job's step jitter).
	MinSaving float64
	// RootCauses of this step, most expensive first.
	RootCauses []RootCause
	// Flagged ranks and Suspects after this step, with hysteresis.
	Flagged  []RankFlag
	Suspects []SuspectFlag
	// Imbalances flagged after this step.
	Imbalances []ImbalanceFlag
	// Attribution is what each kind of work at its reference alone would save in this step
	// (only in steps with root causes; kinds that save nothing left out), largest first.
	Attribution []Saving
	// Groups are the step's process groups' communication phases, by group name.
	Groups []GroupPhase
	// Slowdown is the job's moving average of Duration / WhatIf.
	Slowdown float64
	// Deferred marks a step whose flags (Flagged, Suspects, Imbalances, Slowdown) are left to
	// a verdict stage that sees every step of the job (flag_decision: deferred; Verdicts).
	Deferred bool
	// ReplayError is the replay's self-check in this step: the replayed step fed the
	// measured gaps and transfers against the measured one, as a fraction (the median
	// rank's period on its own clock). ReplayChecked is false when no rank had the previous
	// step to measure a period from.
	ReplayError   float64
	ReplayChecked bool
	// Forced marks a step analyzed before its delay passed (bounds reached).
	Forced bool
	// EndUnixNano is the median over ranks of the end of their last span in the step (each
	// on its own clock): where the step ended, for placing its summary on a timeline.
	EndUnixNano int64
}

func knownName(name string) bool {
	return name != "" && name != semconv.UnknownTopology
}
