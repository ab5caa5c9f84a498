package join

type phaseKey struct {
	job  string
	step int64
	rank int32
}

// phaseEntry is what one rank did in one step: the summed duration of each phase kind,
// and the longest wait of its collectives released so far.
type phaseEntry struct {
	key               phaseKey
	duration          [numPhaseKinds]float64
	seen              uint8
	maxCollectiveWait float64
}

func (p *phaseEntry) value(kind PhaseKind) phaseValue {
	if p.seen&(1<<kind) == 0 {
		return phaseValue{}
	}
	return phaseValue{value: p.duration[kind], ok: true}
}

// phaseCache is a bounded FIFO of per-(job, step, rank) entries: a ring of entries indexed
// by a map, the oldest entry overwritten first. Steps move forward, so FIFO is LRU here.
type phaseCache struct {
	limit   int
	entries []phaseEntry
	next    int
	index   map[phaseKey]int32
}

func newPhaseCache(limit int) phaseCache {
	return phaseCache{limit: limit, index: make(map[phaseKey]int32)}
}

func (c *phaseCache) slot(k phaseKey) *phaseEntry {
	if i, ok := c.index[k]; ok {
		return &c.entries[i]
	}
	var i int
	if len(c.entries) < c.limit {
		c.entries = append(c.entries, phaseEntry{})
		i = len(c.entries) - 1
	} else {
		i = c.next
		delete(c.index, c.entries[i].key)
		c.next++
		if c.next == c.limit {
			c.next = 0
		}
	}
	c.entries[i] = phaseEntry{key: k}
	c.index[k] = int32(i)
	return &c.entries[i]
}

func (c *phaseCache) add(ph Phase) {
	entry := c.slot(phaseKey{job: ph.Job, step: ph.Step, rank: int32(ph.Rank)})
	entry.duration[ph.Kind] += ph.Duration
	entry.seen |= 1 << ph.Kind
}

// addWait keeps the longest collective wait of the rank in the step. The longest, not the
// sum: DDP's bucket all-reduces overlap the rest of backward, so every bucket's wait holds
// the same straggler lateness and only about one of them extends the backward span.
func (c *phaseCache) addWait(job string, step int64, rank int, wait float64) {
	entry := c.slot(phaseKey{job: job, step: step, rank: int32(rank)})
	entry.maxCollectiveWait = max(entry.maxCollectiveWait, wait)
}

// get returns the entry or nil; the pointer is valid until the next add.
func (c *phaseCache) get(job string, step int64, rank int) *phaseEntry {
	if i, ok := c.index[phaseKey{job: job, step: step, rank: int32(rank)}]; ok {
		return &c.entries[i]
	}
	return nil
}
