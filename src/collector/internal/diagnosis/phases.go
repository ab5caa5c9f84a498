package diagnosis

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

// phaseEntry is what one rank did in one step, per phase kind.
type phaseEntry struct {
	key   phaseKey
	kinds [NumPhaseKinds]phaseInterval
	seen  uint8
}

func (p *phaseEntry) get(kind PhaseKind) (phaseInterval, bool) {
	return p.kinds[kind], p.seen&(1<<kind) != 0
}

// phaseCache is a bounded FIFO of per-(job, step, rank) entries: a ring of entries indexed
// by a map, the oldest overwritten first. Steps move forward, so FIFO is LRU here.
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
		if len(c.entries) == cap(c.entries) {
			// Grow as append would, but never past the limit: append's doubling left up to
			// twice the limit's entries allocated (24 of 38 MB at 4096 ranks).
			grown := make([]phaseEntry, len(c.entries), min(c.limit, max(64, 2*cap(c.entries))))
			copy(grown, c.entries)
			c.entries = grown
		}
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

func (c *phaseCache) add(job string, step int64, rank int32, kind PhaseKind, start, end int64) {
	entry := c.slot(phaseKey{job: job, step: step, rank: rank})
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
