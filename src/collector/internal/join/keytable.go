package join

import "hash/maphash"

// keySeed seeds the keys' hashes (one per process: tables are never shared across processes).
var keySeed = maphash.MakeSeed()

// hashKey is the hash a keyTable files a key under. An arrival's key is hashed once, and
// the collective keeps the hash for its release and the released ring: a key's strings
// (job id, group) were hashed again at each of about eight map operations per collective,
// which is most of the join's own work on a point-to-point message (two members), and the
// released ring's old keys were cold in the cache. It is the hash of the key's group (job
// and group strings, hashGroup) mixed with its sequence number (hashSeq), so that the
// members of one collective, which arrive together, and the collectives of one group hash
// their strings once (keyHasher).
func hashKey(k *Key) uint64 {
	return hashSeq(hashGroup(k.Job, k.PG), k.Seq)
}

// hashGroup is the hash of a key's job and group strings.
func hashGroup(job, pg string) uint64 {
	return maphash.Comparable(keySeed, groupRef{job: job, pg: pg})
}

// hashSeq mixes a sequence number into its group's hash (a bijection of the sequence
// number for a given group, then murmur3's finalizer).
func hashSeq(group uint64, seq int64) uint64 {
	h := group ^ uint64(seq)*0x9e3779b97f4a7c15
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// keyHasher is hashKey with the last group's hash kept: arrivals come in runs of one
// group (a collective's members together, a pipeline pair's messages one after another).
type keyHasher struct {
	job, pg string
	group   uint64
	valid   bool
}

// hash returns hashKey(k).
func (c *keyHasher) hash(k *Key) uint64 {
	if !c.valid || k.Job != c.job || k.PG != c.pg {
		c.job, c.pg, c.group, c.valid = k.Job, k.PG, hashGroup(k.Job, k.PG), true
	}
	return hashSeq(c.group, k.Seq)
}

// keyEntry is one key and its value.
type keyEntry[V any] struct {
	key Key
	val V
}

// keyTable maps keys to values by the keys' hashes (hashKey). Keys whose hash another key
// holds (a 64-bit collision: in practice never) go to a second map by the full key, so the
// table means exactly what a map[Key]V would.
type keyTable[V any] struct {
	byHash map[uint64]keyEntry[V]
	// collided holds the keys whose hash slot in byHash holds another key.
	collided map[Key]V
	// hash is hashKey (a test collides keys with its own).
	hash func(*Key) uint64
}

func newKeyTable[V any](size int) keyTable[V] {
	return keyTable[V]{byHash: make(map[uint64]keyEntry[V], size), hash: hashKey}
}

func (t *keyTable[V]) len() int { return len(t.byHash) + len(t.collided) }

// get returns the value of k, whose hash is h (t.hash(k)).
func (t *keyTable[V]) get(h uint64, k *Key) (V, bool) {
	e, ok := t.byHash[h]
	if !ok {
		var zero V
		return zero, false
	}
	if e.key == *k {
		return e.val, true
	}
	v, ok := t.collided[*k]
	return v, ok
}

// set files v under k, whose hash is h.
func (t *keyTable[V]) set(h uint64, k *Key, v V) {
	e, ok := t.byHash[h]
	if !ok || e.key == *k {
		t.byHash[h] = keyEntry[V]{key: *k, val: v}
		return
	}
	if t.collided == nil {
		t.collided = make(map[Key]V)
	}
	t.collided[*k] = v
}

// remove deletes k, whose hash is h.
func (t *keyTable[V]) remove(h uint64, k *Key) {
	e, ok := t.byHash[h]
	if !ok {
		return
	}
	if e.key != *k {
		delete(t.collided, *k)
		return
	}
	delete(t.byHash, h)
	if len(t.collided) == 0 {
		return
	}
	// A key that collided with k takes its slot.
	for ck, cv := range t.collided {
		if t.hash(&ck) == h {
			t.byHash[h] = keyEntry[V]{key: ck, val: cv}
			delete(t.collided, ck)
			return
		}
	}
}

// releasedKey is one release remembered: the collective's key (and its hash), step and
// release time.
type releasedKey struct {
	key  Key
	hash uint64
	step int64
	at   int64
}

// releasedSet remembers the last len(ring) releases in release order, and finds a key's
// latest one by its hash: the map holds ring slots (12 bytes an entry, where keys and
// times made 64), so that the lookups each collective makes stay in the cache. Keys whose
// hash another released key holds go to a map by the full key, as in keyTable.
type releasedSet struct {
	ring     []releasedKey
	pos      int
	byHash   map[uint64]int32
	collided map[Key]int32
	// hash is hashKey (a test collides keys with its own).
	hash func(*Key) uint64
}

func newReleasedSet(size int) releasedSet {
	s := releasedSet{ring: make([]releasedKey, size), byHash: make(map[uint64]int32, size),
		hash: hashKey}
	// Slots never written hold the zero key, as a map entry of it would be looked up.
	zero := hashKey(&Key{})
	for i := range s.ring {
		s.ring[i].hash = zero
	}
	return s
}

// find returns the ring slot of k's latest release (k's hash is h).
func (s *releasedSet) find(h uint64, k *Key) (*releasedKey, bool) {
	i, ok := s.byHash[h]
	if !ok {
		return nil, false
	}
	if s.ring[i].key != *k {
		if i, ok = s.collided[*k]; !ok {
			return nil, false
		}
	}
	return &s.ring[i], true
}

// forget drops k (whose hash is h) from the set; its ring slot stays until it is reused.
func (s *releasedSet) forget(h uint64, k *Key) {
	i, ok := s.byHash[h]
	if !ok {
		return
	}
	if s.ring[i].key != *k {
		delete(s.collided, *k)
		return
	}
	s.forgetSlot(h)
}

// forgetSlot drops the entry of hash h from byHash, whose key it holds (a key that collided
// with it takes its place).
func (s *releasedSet) forgetSlot(h uint64) {
	delete(s.byHash, h)
	if len(s.collided) == 0 {
		return
	}
	// A key that collided with k takes its slot.
	for ck, ci := range s.collided {
		if s.hash(&ck) == h {
			s.byHash[h] = ci
			delete(s.collided, ck)
			return
		}
	}
}

// add remembers a release of k (whose hash is h), in place of the oldest one remembered.
func (s *releasedSet) add(k *Key, h uint64, step, at int64) {
	if len(s.ring) == 0 {
		return
	}
	old := &s.ring[s.pos]
	// The slot's key may have been released again since; only its own entry goes. (find
	// and forget, with the slot's hash looked up once where it holds the key's entry.)
	if i, ok := s.byHash[old.hash]; ok && s.ring[i].key == old.key {
		if s.ring[i].at == old.at {
			s.forgetSlot(old.hash)
		}
	} else if latest, ok := s.find(old.hash, &old.key); ok && latest.at == old.at {
		s.forget(old.hash, &old.key)
	}
	*old = releasedKey{key: *k, hash: h, step: step, at: at}
	if i, ok := s.byHash[h]; !ok || s.ring[i].key == *k {
		s.byHash[h] = int32(s.pos)
	} else {
		if s.collided == nil {
			s.collided = make(map[Key]int32)
		}
		s.collided[*k] = int32(s.pos)
	}
	s.pos++
	if s.pos == len(s.ring) {
		s.pos = 0
	}
}

// len is how many keys the set holds.
func (s *releasedSet) len() int { return len(s.byHash) + len(s.collided) }
