package diagnosis

import (
	"fmt"
	"math"
	"os"
	"strconv"
)

func init() {
	if os.Getenv("DBG_STEP") == "" {
		return
	}
	want, _ := strconv.Atoi(os.Getenv("DBG_STEP"))
	debugHook = func(m *model, sd *stepData) {
		if sd.step != int64(want) {
			return
		}
		var a0 int64 = math.MaxInt64
		v0 := math.Inf(1)
		for p := range m.order {
			a0 = min(a0, sd.ops[m.order[p]].start)
			v0 = min(v0, m.launch[p])
		}
		fmt.Println("excess", m.excess, "classes", m.classes, "stage", m.stage)
		for ri, rank := range m.rankOf {
			fmt.Printf("rank %d entry %.2f prevEnd %.2f\n", rank, (m.entry[ri]-v0)*1e3, float64(m.prevEnd[ri]-a0)/1e6)
			for q := m.rankStart[ri]; q < m.rankStart[ri+1]; q++ {
				op := &sd.ops[m.order[q]]
				rec := &sd.colls[m.coll[q]]
				fmt.Printf("  %-10s r%d %-5v actual %7.2f-%7.2f virtual %7.2f-%7.2f gap %6.2f ref %6.2f dep %3d c %2d T %5.2f\n",
					rec.op, op.role, op.async, float64(op.start-a0)/1e6, float64(op.end-a0)/1e6,
					(m.launch[q]-v0)*1e3, (m.actualEnd[q]-v0)*1e3, m.gap[q]*1e3, m.refGap[q]*1e3, m.depEnd[q], m.coll[q], m.replayT[m.coll[q]]*1e3)
			}
		}
	}
}
