package diagnosis

import "math"

type phaseKey struct {
	job  string
	step int64
	rank int32
}

// phaseInterval is where one kind of phase lay on the rank's clock in one step: from the
// first span's start to the last span's end, and the spans' summed duration.
type phaseInterval struct {
	start, end int64
	total      int64
}

// phaseSpan is one data or compute phase span of a rank (dataloader.fetch, forward,
// backward, optimizer.step) on its own clock: the step model reads which of them lay in
// each of its gaps (a pipeline rank runs a forward or backward per microbatch between its
// messages), where the kind's intervals alone span most of the step.
type phaseSpan struct {
	start int64
	// dur is the span's duration in nanoseconds (a span over 4.29 s is kept at that).
	dur  uint32
	kind PhaseKind
}

func (s phaseSpan) end() int64 { return s.start + int64(s.dur) }

// maxPhaseSpans bounds the spans one entry keeps (256 microbatches' forward and backward,
// or 64 of an interleaved schedule with two chunks); past it the entry's spans are dropped
// (spansLost) and the analysis reads the kinds' intervals as before.
const maxPhaseSpans = 512

// phaseEntry is what one rank did in one step, per phase kind.
type phaseEntry struct {
	key   phaseKey
	kinds [NumPhaseKinds]phaseInterval
	seen  uint8
	// spans are the entry's data and compute spans in arrival order; spansLost is set
	// when more than maxPhaseSpans came.
	spans     []phaseSpan
	spansLost bool
	// input is the summed training.input.size of the rank's forwards in the step, and
	// inputs how many forwards gave one (every forward must, for the sum to be its work).
	input        int64
	inputs, fwds int32
}

// inputSize returns the rank's input in the step, when every forward of it gave one.
func (p *phaseEntry) inputSize() (int64, bool) {
	return p.input, p.fwds > 0 && p.inputs == p.fwds
}

func (p *phaseEntry) get(kind PhaseKind) (phaseInterval, bool) {
	return p.kinds[kind], p.seen&(1<<kind) != 0
}

// phaseCache is a bounded FIFO of per-(job, step, rank) entries: a ring of entries indexed
// by a map, the oldest overwritten first. Steps move forward, so FIFO is LRU here. The oldest
// entry is reused before the ring grows when it is stale: its step is older than its job's
// last analyzed step (an analysis reads its own step and the one before), its job was
// forgotten by the analysis, or it is of the job's last analyzed step and the job added no
// entry for a whole lap of the ring as it was then (a job that ended: its last step would
// otherwise stay at the head for good and the ring grow to its limit; the price is that a job
// pausing that long loses its previous step's phases, which its next analysis reads beside
// its own). So the cache holds about the steps still open, not limit entries (at 4096 ranks,
// 2-3 steps instead of 16, ~12 MB less).
type phaseCache struct {
	limit   int
	entries []phaseEntry
	// next is the oldest entry's index once the ring has wrapped (0 before).
	next  int
	index map[phaseKey]int32
	// analyzed is each job's last analyzed step (forgottenJob once the analysis forgot it).
	analyzed map[string]int64
	// added counts the entries ever created; lastAdded is when each job's latest was.
	added     uint64
	lastAdded map[string]jobAdded
}

// jobAdded is when a job's latest entry was created: the value of added and the ring's length.
type jobAdded struct {
	at      uint64
	ringLen int
}

// forgottenJob marks a job the analysis forgot: all its entries are stale.
const forgottenJob = math.MaxInt64

// maxAnalyzedJobs bounds phaseCache.analyzed and lastAdded; past it they start over (entries
// are then kept until a lap or the limit forces them out).
const maxAnalyzedJobs = 4096

func newPhaseCache(limit int) phaseCache {
	return phaseCache{
		limit: limit, index: make(map[phaseKey]int32),
		analyzed: make(map[string]int64), lastAdded: make(map[string]jobAdded),
	}
}

// setAnalyzed records that the job's steps up to step were analyzed.
func (c *phaseCache) setAnalyzed(job string, step int64) {
	if _, ok := c.analyzed[job]; !ok && len(c.analyzed) >= maxAnalyzedJobs {
		clear(c.analyzed)
	}
	c.analyzed[job] = step
}

// forget makes the entries of a job the analysis forgot stale.
func (c *phaseCache) forget(job string) { c.setAnalyzed(job, forgottenJob) }

// known clears what forget recorded, for a job the analysis starts again under that name.
func (c *phaseCache) known(job string) {
	if c.analyzed[job] == forgottenJob {
		delete(c.analyzed, job)
	}
}

func (c *phaseCache) stale(e *phaseEntry) bool {
	step, ok := c.analyzed[e.key.job]
	switch {
	case !ok || e.key.step > step:
		return false
	case e.key.step < step:
		return true
	default:
		// The ring's length then, not now: while this entry blocks the head the ring grows by
		// one entry per insertion, and a lap measured on the growing ring would never end.
		last, ok := c.lastAdded[e.key.job]
		return !ok || c.added-last.at > uint64(last.ringLen)
	}
}

func (c *phaseCache) slot(k phaseKey) *phaseEntry {
	if i, ok := c.index[k]; ok {
		return &c.entries[i]
	}
	var i int
	if n := len(c.entries); n > 0 && (n >= c.limit || c.stale(&c.entries[c.next])) {
		// Reuse the oldest.
		i = c.next
		delete(c.index, c.entries[i].key)
		c.next++
		if c.next == n {
			c.next = 0
		}
	} else {
		if n == cap(c.entries) || c.next != 0 {
			// Grow as append would, but never past the limit (append's doubling left up to
			// twice the limit's entries allocated: 24 of 38 MB at 4096 ranks), and put a
			// wrapped ring back in age order so that the new entry is the newest.
			grown := make([]phaseEntry, 0, min(c.limit, max(64, 2*n)))
			grown = append(grown, c.entries[c.next:]...)
			grown = append(grown, c.entries[:c.next]...)
			if c.next != 0 {
				for j := range grown {
					c.index[grown[j].key] = int32(j)
				}
			}
			c.entries, c.next = grown, 0
		}
		c.entries = append(c.entries, phaseEntry{})
		i = len(c.entries) - 1
	}
	c.entries[i] = phaseEntry{key: k, spans: c.entries[i].spans[:0]}
	c.index[k] = int32(i)
	c.added++
	if _, ok := c.lastAdded[k.job]; !ok && len(c.lastAdded) >= maxAnalyzedJobs {
		clear(c.lastAdded)
	}
	c.lastAdded[k.job] = jobAdded{at: c.added, ringLen: len(c.entries)}
	return &c.entries[i]
}

func (c *phaseCache) add(job string, step int64, rank int32, kind PhaseKind,
	start, end, input int64,
) {
	entry := c.slot(phaseKey{job: job, step: step, rank: rank})
	if kind == PhaseForward {
		entry.fwds++
		if input > 0 {
			entry.input += input
			entry.inputs++
		}
	}
	if kind >= PhaseFetch && kind <= PhaseOptimizer && !entry.spansLost {
		if len(entry.spans) < maxPhaseSpans {
			entry.spans = append(entry.spans, phaseSpan{start: start,
				dur: uint32(min(end-start, math.MaxUint32)), kind: kind})
		} else {
			entry.spans, entry.spansLost = entry.spans[:0], true
		}
	}
	iv := &entry.kinds[kind]
	if entry.seen&(1<<kind) == 0 {
		*iv = phaseInterval{start: start, end: end}
		entry.seen |= 1 << kind
	} else {
		iv.start = min(iv.start, start)
		iv.end = max(iv.end, end)
	}
	iv.total += end - start
}

// get returns the entry or nil; the pointer is valid until the next add.
func (c *phaseCache) get(job string, step int64, rank int32) *phaseEntry {
	if i, ok := c.index[phaseKey{job: job, step: step, rank: rank}]; ok {
		return &c.entries[i]
	}
	return nil
}

func (c *phaseCache) len() int { return len(c.index) }
