package join

import "testing"

// Keys whose hashes collide (every key hashes alike here) keep their own values, and the
// ones left stay findable whichever goes first.
func TestKeyTableKeepsCollidingKeysApart(t *testing.T) {
	tab := newKeyTable[int](0)
	tab.hash = func(*Key) uint64 { return 42 }
	a, b, c := Key{Job: "j", PG: "a", Seq: 1}, Key{Job: "j", PG: "b", Seq: 1}, Key{Job: "j", PG: "c", Seq: 1}
	set := func(k Key, v int) { tab.set(tab.hash(&k), &k, v) }
	get := func(k Key) (int, bool) { return tab.get(tab.hash(&k), &k) }
	remove := func(k Key) { tab.remove(tab.hash(&k), &k) }
	set(a, 1)
	set(b, 2)
	set(c, 3)
	set(b, 20)
	if tab.len() != 3 {
		t.Fatalf("len %d, want 3", tab.len())
	}
	for k, want := range map[Key]int{a: 1, b: 20, c: 3} {
		if got, ok := get(k); !ok || got != want {
			t.Fatalf("get %v: %d %v, want %d", k, got, ok, want)
		}
	}
	remove(a)
	if _, ok := get(a); ok {
		t.Fatal("removed key still found")
	}
	for k, want := range map[Key]int{b: 20, c: 3} {
		if got, ok := get(k); !ok || got != want {
			t.Fatalf("after removing the slot's holder, get %v: %d %v, want %d", k, got, ok, want)
		}
	}
	remove(c)
	remove(b)
	if tab.len() != 0 {
		t.Fatalf("len %d after removing every key, want 0", tab.len())
	}
	if _, ok := get(b); ok {
		t.Fatal("removed key still found")
	}
}

// Released keys whose hashes collide keep their own releases; a release's slot, once
// reused, forgets only its own key.
func TestReleasedSetKeepsCollidingKeysApart(t *testing.T) {
	s := newReleasedSet(3)
	s.hash = func(*Key) uint64 { return 7 }
	a, b, c, d := Key{Job: "j", PG: "a"}, Key{Job: "j", PG: "b"}, Key{Job: "j", PG: "c"}, Key{Job: "j", PG: "d"}
	find := func(k Key) (*releasedKey, bool) { return s.find(s.hash(&k), &k) }
	for i, k := range []Key{a, b, c} {
		s.add(&k, s.hash(&k), int64(i), int64(100+i))
	}
	for i, k := range []Key{a, b, c} {
		if r, ok := find(k); !ok || r.step != int64(i) || r.at != int64(100+i) {
			t.Fatalf("find %v: %+v %v", k, r, ok)
		}
	}
	// d takes a's slot: a is forgotten, b and c stay.
	s.add(&d, s.hash(&d), 3, 103)
	if _, ok := find(a); ok {
		t.Fatal("the oldest release is still found after its slot was reused")
	}
	for _, k := range []Key{b, c, d} {
		if _, ok := find(k); !ok {
			t.Fatalf("%v lost", k)
		}
	}
	s.forget(s.hash(&c), &c)
	if _, ok := find(c); ok {
		t.Fatal("forgotten key still found")
	}
	if s.len() != 2 {
		t.Fatalf("len %d, want 2", s.len())
	}
}
