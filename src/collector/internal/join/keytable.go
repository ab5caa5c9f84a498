package join

import "hash/maphash"

// keySeed seeds the keys' hashes (one per process: tables are never shared across processes).
var keySeed = maphash.MakeSeed()

// hashKey is the hash a keyTable files a key under. An arrival's key is hashed once, and
// the collective keeps the hash for its release and the released ring: a key's strings
// (job id, group) were hashed again at each of about eight map operations per collective,
// which is most of the join's own work on a point-to-point message (two members), and the
// released ring's old keys were cold in the cache.
func hashKey(k *Key) uint64 {
	return maphash.Comparable(keySeed, *k)
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
