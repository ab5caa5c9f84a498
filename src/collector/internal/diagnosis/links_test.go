package diagnosis

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// judgeGroups folds judged transfers into groups: slow groups sum what their slow transfers
// lost; a group is healthy evidence only through a healthy transfer at least
// 1/healthyBytesRatio of the smallest slow transfer's bytes, with no such transfer in between.
func TestJudgeGroupsFoldsTransfersIntoGroups(t *testing.T) {
	const mb = 1 << 20
	type coll struct {
		group                int32
		bytes                int64
		transfer, ref        float64
		hasRef, slow, health bool
	}
	colls := []coll{
		// group 0: two slow transfers (the smallest slow one moved 1 MB).
		{group: 0, bytes: mb, transfer: 0.5, ref: 0.2, hasRef: true, slow: true},
		{group: 0, bytes: 4 * mb, transfer: 0.6, ref: 0.4, hasRef: true, slow: true},
		// group 1: a large healthy transfer.
		{group: 1, bytes: mb / healthyBytesRatio, transfer: 0.1, ref: 0.1, hasRef: true, health: true},
		// group 2: a healthy transfer too small to show a slow link.
		{group: 2, bytes: mb/healthyBytesRatio - 1, transfer: 0.1, ref: 0.1, hasRef: true, health: true},
		// group 3: a large healthy transfer and a large one in between.
		{group: 3, bytes: mb, transfer: 0.1, ref: 0.1, hasRef: true, health: true},
		{group: 3, bytes: mb, transfer: 0.15, ref: 0.1, hasRef: true},
		// group 4: a small transfer in between does not cast doubt.
		{group: 4, bytes: mb, transfer: 0.1, ref: 0.1, hasRef: true, health: true},
		{group: 4, bytes: 1, transfer: 0.15, ref: 0.1, hasRef: true},
		// group 5: no reference, not seen (even when marked slow).
		{group: 5, bytes: mb, transfer: 9, slow: true},
	}
	m := &model{pgIDs: map[string]int32{}}
	sd := &stepData{}
	l := &m.links
	for _, c := range colls {
		m.pgIDs[fmt.Sprint("pg", c.group)] = c.group
		sd.colls = append(sd.colls, collRec{bytes: c.bytes})
		m.pgID = append(m.pgID, c.group)
		m.transfer = append(m.transfer, c.transfer)
		l.refT = append(l.refT, c.ref)
		l.hasRef = append(l.hasRef, c.hasRef)
		l.slow = append(l.slow, c.slow)
		l.healthy = append(l.healthy, c.health)
	}
	if !m.judgeGroups(sd) {
		t.Fatal("no slow group")
	}
	wantSeen := []bool{true, true, true, true, true, false}
	wantSlow := []bool{true, false, false, false, false, false}
	wantHealthy := []bool{false, true, false, false, true, false}
	if !slices.Equal(l.groupSeen, wantSeen) || !slices.Equal(l.groupSlow, wantSlow) {
		t.Errorf("seen %v slow %v, want %v %v", l.groupSeen, l.groupSlow, wantSeen, wantSlow)
	}
	for g := range wantHealthy {
		if got := l.healthyGroup(g); got != wantHealthy[g] {
			t.Errorf("group %d healthy evidence %v, want %v", g, got, wantHealthy[g])
		}
	}
	if math.Abs(l.groupExcess[0]-0.5) > 1e-12 {
		t.Errorf("group 0 lost %g, want 0.5 (0.3 + 0.2)", l.groupExcess[0])
	}
	if !l.anyHealthyGroup() {
		t.Error("no healthy group")
	}
	// The same step without its slow transfers has nothing to locate.
	clear(l.slow)
	if m.judgeGroups(sd) {
		t.Error("slow groups without a slow transfer")
	}
}

// cover names, round by round, the elements of no healthy group whose uncovered slow groups
// lost the most time, the most specific kind on a tie, none when too many tie.
func TestCoverChoosesWhatLostTheMostTime(t *testing.T) {
	nic := func(host string) Suspect { return Suspect{Kind: SuspectNIC, Name: "eth0", Host: host} }
	host := func(name string) Suspect { return Suspect{Kind: SuspectHost, Name: name} }
	sw := func(name string) Suspect { return Suspect{Kind: SuspectSwitch, Name: name} }
	type element struct {
		s       Suspect
		groups  []int32
		healthy int32
	}
	for _, tc := range []struct {
		name     string
		excess   []float64 // per slow group
		elements []element
		want     string
	}{
		{name: "time lost beats the number of groups",
			excess: []float64{1, 0.2, 0.2},
			elements: []element{
				{s: sw("leaf1"), groups: []int32{1, 2}},
				{s: host("node3"), groups: []int32{0}},
			},
			want: "[host:node3[0] switch:leaf1[1 2]]"},
		{name: "a tie goes to the most specific kind",
			excess: []float64{0.5, 0.5},
			elements: []element{
				{s: sw("leaf1"), groups: []int32{0, 1}},
				{s: host("node3"), groups: []int32{0, 1}},
				{s: nic("node3"), groups: []int32{0, 1}},
			},
			want: "[nic:node3/eth0[0 1]]"},
		{name: "an element of a healthy group is never named",
			excess: []float64{1, 1},
			elements: []element{
				{s: sw("leaf1"), groups: []int32{0, 1}, healthy: 1},
				{s: host("node3"), groups: []int32{0}},
			},
			want: "[host:node3[0]]"},
		{name: "a later round names only the groups left",
			excess: []float64{1, 1, 0.5},
			elements: []element{
				{s: host("node1"), groups: []int32{0, 1}},
				{s: host("node2"), groups: []int32{1, 2}},
			},
			want: "[host:node1[0 1] host:node2[2]]"},
		{name: "two tied elements are both named",
			excess: []float64{1},
			elements: []element{
				{s: host("node1"), groups: []int32{0}},
				{s: host("node2"), groups: []int32{0}},
			},
			want: "[host:node1[0] host:node2[0]]"},
		{name: "more tied elements than maxAmbiguous name none",
			excess: []float64{1},
			elements: []element{
				{s: host("node1"), groups: []int32{0}},
				{s: host("node2"), groups: []int32{0}},
				{s: host("node3"), groups: []int32{0}},
			},
			want: "[]"},
		{name: "at most maxCover rounds",
			excess: []float64{5, 4, 3, 2, 1},
			elements: []element{
				{s: host("node1"), groups: []int32{0}},
				{s: host("node2"), groups: []int32{1}},
				{s: host("node3"), groups: []int32{2}},
				{s: host("node4"), groups: []int32{3}},
				{s: host("node5"), groups: []int32{4}},
			},
			want: "[host:node1[0] host:node2[1] host:node3[2] host:node4[3]]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &linkScratch{
				groupSlow:   make([]bool, len(tc.excess)),
				groupExcess: tc.excess,
			}
			var slowGroups []int32
			for g := range tc.excess {
				l.groupSlow[g] = true
				slowGroups = append(slowGroups, int32(g))
			}
			for _, e := range tc.elements {
				l.elemName = append(l.elemName, e.s)
				l.elemSlow = append(l.elemSlow, int32(len(e.groups)))
				l.elemHealthy = append(l.elemHealthy, e.healthy)
				l.elemGroups = append(l.elemGroups, e.groups)
			}
			var got []string
			for _, loc := range l.cover(slowGroups) {
				got = append(got, fmt.Sprint(loc.suspect.ID(), loc.groups))
			}
			if s := "[" + strings.Join(got, " ") + "]"; s != tc.want {
				t.Errorf("located %s, want %s", s, tc.want)
			}
		})
	}
}

// markElements marks the elements each slow or healthy group uses: hosts always, NICs only
// for a group across hosts, uplinks only for a group across switches; a slow group lists
// itself under each of its elements once, however many of its members share it.
func TestMarkElementsCountsTheGroupsEachElementCarries(t *testing.T) {
	j := &jobState{}
	for r := range int32(8) {
		j.topology.set(r, Topology{Host: fmt.Sprintf("node%d", r/2), NIC: "eth0",
			Switch: fmt.Sprintf("leaf%d", r/4)})
	}
	sd := &stepData{}
	m := &model{}
	l := &m.links
	// group 0 (slow): ranks 0, 1 (one host); group 1 (slow): ranks 1, 2 (two hosts, one
	// switch); group 2 (healthy): ranks 3, 4 (two switches); group 3: neither.
	for g, ranks := range [][]int32{{0, 1}, {1, 2}, {3, 4}, {6, 7}} {
		sd.colls = append(sd.colls, collRec{first: int32(len(sd.ops)), n: int32(len(ranks))})
		for _, r := range ranks {
			sd.ops = append(sd.ops, opRec{rank: r})
		}
		l.groupColl = append(l.groupColl, int32(g))
		l.groupSeen = append(l.groupSeen, true)
	}
	l.groupSlow = []bool{true, true, false, false}
	l.groupHealthy = []bool{false, false, true, false}
	if got := m.markElements(j, sd); !slices.Equal(got, []int32{0, 1}) {
		t.Fatalf("slow groups %v, want [0 1]", got)
	}
	got := map[string]string{}
	for e, s := range l.elemName {
		got[s.ID()] = fmt.Sprintf("slow %d %v healthy %d", l.elemSlow[e], l.elemGroups[e], l.elemHealthy[e])
	}
	want := map[string]string{
		"host:node0":     "slow 2 [0 1] healthy 0",
		"host:node1":     "slow 1 [1] healthy 1",
		"nic:node0/eth0": "slow 1 [1] healthy 0",
		"nic:node1/eth0": "slow 1 [1] healthy 1",
		"switch:leaf0":   "slow 2 [0 1] healthy 1",
		"host:node2":     "slow 0 [] healthy 1",
		"nic:node2/eth0": "slow 0 [] healthy 1",
		"switch:leaf1":   "slow 0 [] healthy 1",
		"uplink:leaf0":   "slow 0 [] healthy 1",
		"uplink:leaf1":   "slow 0 [] healthy 1",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("elements\n%v\nwant\n%v", got, want)
	}
}

// A transfer baseline learned from a slow start (60 ms falling to 25 ms) starts over at the
// new level once three transfers in a row ran below half its mean and below it by more than
// its deviation, keeping its relative deviation; a small message read at its fastest four
// times in a row (less than min_transfer_excess below its mean) does not start it over.
func TestTransferBaselineForgetsASlowStart(t *testing.T) {
	var b transferBaseline
	for _, v := range []float64{0.090, 0.070, 0.060, 0.050, 0.045, 0.040} {
		b.add(v, 0.001)
	}
	slowMean, relDev := b.mean, b.dev/b.mean
	b.add(0.025, 0.001)
	b.add(0.024, 0.001)
	if b.mean < 0.8*slowMean {
		t.Fatalf("started over after two low transfers: mean %.4f", b.mean)
	}
	b.add(0.026, 0.001)
	if math.Abs(b.mean-0.025) > 1e-9 {
		t.Fatalf("mean %.4f after three low transfers, want their mean 0.025", b.mean)
	}
	if math.Abs(b.dev/b.mean-relDev) > 1e-9 || b.samples != 9 {
		t.Fatalf("dev %.4f (relative %.3f, want %.3f), samples %d", b.dev, b.dev/b.mean, relDev,
			b.samples)
	}

	var small transferBaseline
	for range 10 {
		small.add(0.0012, 0.001)
		small.add(0.0004, 0.001)
	}
	before := small.mean
	for range 4 {
		small.add(0.0003, 0.001)
	}
	if small.mean < 0.5*before {
		t.Fatalf("a jittering small message's baseline started over: %.5f from %.5f", small.mean,
			before)
	}
}
