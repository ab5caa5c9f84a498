package barrierskewconnector // import "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

import (
	"sort"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

const scopeName = "github.com/skewtrace/skewtrace/src/collector/connector/barrierskewconnector"

type collectiveKey struct {
	job, pg, op string
}

type rankKey struct {
	job  string
	rank int
	join.Topology
}

type missingKey struct {
	job  string
	rank int
}

type hostKey struct {
	job, host string
}

type suspectKey struct {
	job string
	diagnosis.Suspect
}

// imbalanceKey is one imbalance of one job (stage -1 for data).
type imbalanceKey struct {
	job   string
	cause string
	stage int
}

// imbalanceGauge is one imbalance's flag and cost.
type imbalanceGauge struct {
	updated time.Time
	active  bool
	cost    float64
}

// attributionKey is one kind of work of one job.
type attributionKey struct {
	job  string
	kind string
}

// attributionGauge is what one kind of work at its reference would save the job per step
// (moving average).
type attributionGauge struct {
	updated time.Time
	saves   float64
}

// groupKey is one process group of one job, with the switches its members sit behind.
type groupKey struct {
	job, pg, op, switches, hosts string
}

// groupGauge is a group's communication phase in the job's step (moving averages).
type groupGauge struct {
	updated         time.Time
	start, duration float64
}

// jobName keys the per-job gauges.
type jobName string

func (k collectiveKey) jobOf() string { return k.job }
func (k rankKey) jobOf() string       { return k.job }
func (k missingKey) jobOf() string    { return k.job }
func (k hostKey) jobOf() string       { return k.job }
func (k suspectKey) jobOf() string    { return k.job }
func (k jobName) jobOf() string       { return string(k) }
func (k imbalanceKey) jobOf() string  { return k.job }

func (k attributionKey) jobOf() string { return k.job }
func (k groupKey) jobOf() string       { return k.job }

// seriesKey is a series key that says which job it belongs to.
type seriesKey interface {
	comparable
	jobOf() string
}

// jobSeries is what the aggregator knows of one job's series: when the job last reported,
// how much it has reported, and how to forget each of its series (so a job can be dropped
// whole).
type jobSeries struct {
	lastUsed     time.Time
	observations int64
	forget       []func()
}

type exemplar struct {
	traceID pcommon.TraceID
	spanID  pcommon.SpanID
	value   float64
	time    pcommon.Timestamp
}

type histogram struct {
	start   pcommon.Timestamp
	updated time.Time
	// dirty: observed since it was last emitted.
	dirty     bool
	counts    []uint64
	count     uint64
	sum       float64
	exemplars []exemplar
	nextEx    int
}

type rankStraggler struct {
	start   pcommon.Timestamp
	updated time.Time
	flagged bool
	cause   string
	// causes are the cause labels this rank has reported; each keeps a series (0 unless it
	// is the current cause of a flagged rank) so a changed or cleared cause reads 0.
	causes []string
	// cost is the seconds per step the flagged rank has cost recently (0 when cleared).
	cost float64
}

// suspectGauge is one suspect's flag and cost.
type suspectGauge struct {
	updated time.Time
	active  bool
	cost    float64
}

// jobGauge is a job's what-if slowdown, its replay's self-check error (moving average; -1
// before the first check) and the last step analyzed.
type jobGauge struct {
	updated     time.Time
	slowdown    float64
	replayError float64
	step        int64
}

type offsetGauge struct {
	updated time.Time
	value   float64
}

type incompleteCounter struct {
	start   pcommon.Timestamp
	updated time.Time
	count   int64
}

// aggregator turns released collectives (joined here or annotated by the processor) and
// train.step spans into cumulative metrics. Every map is bounded by max_series (new series
// beyond it are dropped and counted) and series idle for series_idle_timeout are forgotten.
type aggregator struct {
	cfg *Config

	skew         map[collectiveKey]*histogram
	transfer     map[collectiveKey]*histogram
	lateness     map[rankKey]*histogram
	wait         map[rankKey]*histogram
	stepDuration map[rankKey]*histogram
	stragglers   map[rankKey]*rankStraggler
	suspects     map[suspectKey]*suspectGauge
	imbalances   map[imbalanceKey]*imbalanceGauge
	attribution  map[attributionKey]*attributionGauge
	groups       map[groupKey]*groupGauge
	jobs         map[jobName]*jobGauge
	incomplete   map[collectiveKey]*incompleteCounter
	missing      map[missingKey]*incompleteCounter
	offsets      map[hostKey]*offsetGauge
	// byJob indexes every series by job, bounded by max_jobs: a new job beyond it makes the
	// job that reported least forget its series (counted in jobsForgotten).
	byJob map[string]*jobSeries

	seriesDropped int64
	jobsForgotten int64
	// lastFull is when build last emitted every histogram (not only the changed ones).
	lastFull time.Time
	// now is the time of the observation being recorded (for the jobs' recency).
	now time.Time
}

func newAggregator(cfg *Config) *aggregator {
	return &aggregator{
		cfg:          cfg,
		skew:         make(map[collectiveKey]*histogram),
		transfer:     make(map[collectiveKey]*histogram),
		lateness:     make(map[rankKey]*histogram),
		wait:         make(map[rankKey]*histogram),
		stepDuration: make(map[rankKey]*histogram),
		stragglers:   make(map[rankKey]*rankStraggler),
		suspects:     make(map[suspectKey]*suspectGauge),
		imbalances:   make(map[imbalanceKey]*imbalanceGauge),
		attribution:  make(map[attributionKey]*attributionGauge),
		groups:       make(map[groupKey]*groupGauge),
		jobs:         make(map[jobName]*jobGauge),
		byJob:        make(map[string]*jobSeries),
		incomplete:   make(map[collectiveKey]*incompleteCounter),
		missing:      make(map[missingKey]*incompleteCounter),
		offsets:      make(map[hostKey]*offsetGauge),
	}
}

// lookup returns the series for key, creating it within max_series (nil when full) and
// within max_jobs (the series of the job that reported least are forgotten to make room).
func lookup[K seriesKey, V any](a *aggregator, m map[K]*V, key K, create func() *V) *V {
	if v, ok := m[key]; ok {
		a.touchJob(key.jobOf(), nil)
		return v
	}
	if len(m) >= a.cfg.MaxSeries {
		a.seriesDropped++
		return nil
	}
	v := create()
	m[key] = v
	a.touchJob(key.jobOf(), func() { delete(m, key) })
	return v
}

// touchJob marks a job as reporting now, registering forget for a new series of it; a job
// new beyond max_jobs first makes the one that reported least forget its series.
func (a *aggregator) touchJob(job string, forget func()) {
	js := a.byJob[job]
	if js == nil {
		if len(a.byJob) >= a.cfg.MaxJobs {
			a.forgetOldestJob()
		}
		js = &jobSeries{}
		a.byJob[job] = js
	}
	js.lastUsed = a.now
	js.observations++
	if forget != nil {
		js.forget = append(js.forget, forget)
	}
}

// forgetOldestJob forgets the series of the job that reported least (the least recently among
// equals): a job that keeps training keeps its series however many one-off job ids arrive.
func (a *aggregator) forgetOldestJob() {
	var victim string
	var least *jobSeries
	for job, js := range a.byJob {
		if least == nil || js.observations < least.observations ||
			(js.observations == least.observations && js.lastUsed.Before(least.lastUsed)) {
			victim, least = job, js
		}
	}
	for _, forget := range least.forget {
		forget()
	}
	delete(a.byJob, victim)
	a.jobsForgotten++
}

func (a *aggregator) newHistogram(now time.Time) *histogram {
	return &histogram{
		start:  pcommon.NewTimestampFromTime(now),
		counts: make([]uint64, len(a.cfg.HistogramBuckets)+1),
	}
}

func (a *aggregator) observe(h *histogram, now time.Time, value float64, ref spanRef) {
	if h == nil {
		return
	}
	h.updated = now
	h.dirty = true
	h.counts[sort.SearchFloat64s(a.cfg.HistogramBuckets, value)]++
	h.count++
	h.sum += value
	if a.cfg.ExemplarsPerPoint == 0 || ref.traceID.IsEmpty() {
		return
	}
	ex := exemplar{traceID: ref.traceID, spanID: ref.spanID, value: value,
		time: pcommon.NewTimestampFromTime(now)}
	if len(h.exemplars) < a.cfg.ExemplarsPerPoint {
		h.exemplars = append(h.exemplars, ex)
		return
	}
	h.exemplars[h.nextEx] = ex
	h.nextEx = (h.nextEx + 1) % len(h.exemplars)
}

// collective is one released collective as the aggregator sees it.
type collective struct {
	key          collectiveKey
	skew         float64
	transfer     float64
	missingRanks int
	// missing names the ranks that never arrived (as far as known).
	missing []int
	// released is why an incomplete collective was released ("" when complete or not said).
	released string
	// skewRef is the span the skew exemplar points at (the last arrival's).
	skewRef spanRef
}

// memberObservation is one member's figures and verdict.
type memberObservation struct {
	rank        rankKey
	lateness    float64
	wait        float64
	clockOffset float64
	ref         spanRef
}

func (a *aggregator) observeCollective(now time.Time, c collective) {
	a.now = now
	a.observe(lookup(a, a.skew, c.key, func() *histogram { return a.newHistogram(now) }),
		now, c.skew, c.skewRef)
	// An incomplete collective's transfer is not the network's: a member never arrived.
	if c.missingRanks == 0 {
		a.observe(lookup(a, a.transfer, c.key, func() *histogram { return a.newHistogram(now) }),
			now, c.transfer, c.skewRef)
	}
	newCounter := func() *incompleteCounter {
		return &incompleteCounter{start: pcommon.NewTimestampFromTime(now)}
	}
	// A shutdown or a partial release (just after a start) is not evidence that a member
	// was missing; an eviction is incomplete but says nothing of who; only a timeout names
	// missing ranks. A processor that did not say (older) is taken at its word.
	released := c.released
	if c.missingRanks > 0 && released != semconv.ReleasedShutdown &&
		released != semconv.ReleasedPartial {
		if ctr := lookup(a, a.incomplete, c.key, newCounter); ctr != nil {
			ctr.count++
			ctr.updated = now
		}
	}
	if released != "" && released != semconv.ReleasedTimeout {
		return
	}
	for _, rank := range c.missing {
		if ctr := lookup(a, a.missing, missingKey{job: c.key.job, rank: rank},
			newCounter); ctr != nil {
			ctr.count++
			ctr.updated = now
		}
	}
}

func (a *aggregator) observeMember(now time.Time, m memberObservation) {
	a.now = now
	newHist := func() *histogram { return a.newHistogram(now) }
	a.observe(lookup(a, a.lateness, m.rank, newHist), now, m.lateness, m.ref)
	a.observe(lookup(a, a.wait, m.rank, newHist), now, m.wait, m.ref)
	if m.rank.Host != "" {
		if g := lookup(a, a.offsets, hostKey{job: m.rank.job, host: m.rank.Host},
			func() *offsetGauge { return &offsetGauge{value: m.clockOffset} }); g != nil {
			g.value += a.cfg.ClockOffsetSmoothing * (m.clockOffset - g.value)
			g.updated = now
		}
	}
}

// observeStepResult applies one analyzed step: the job's flagged ranks (with cause and
// cost), its suspects, and its what-if slowdown. A step older than the job's last one
// applied (a summary that arrived late) changes nothing.
func (a *aggregator) observeStepResult(now time.Time, res *diagnosis.StepResult) {
	a.now = now
	g := lookup(a, a.jobs, jobName(res.Job), func() *jobGauge {
		return &jobGauge{step: -1, replayError: -1}
	})
	if g == nil {
		return
	}
	if res.Step < g.step {
		return
	}
	g.step = res.Step
	g.updated = now
	g.slowdown = res.Slowdown
	if res.ReplayChecked {
		if g.replayError < 0 {
			g.replayError = res.ReplayError
		} else {
			g.replayError += replayErrorAlpha * (res.ReplayError - g.replayError)
		}
	}
	a.observeImbalances(now, res)
	a.observeAttribution(now, res)
	a.observeGroups(now, res)
	flagged := make(map[int]*diagnosis.RankFlag, len(res.Flagged))
	for i := range res.Flagged {
		flagged[res.Flagged[i].Rank] = &res.Flagged[i]
	}
	for key, s := range a.stragglers {
		if key.job != res.Job {
			continue
		}
		f := flagged[key.rank]
		if f == nil || f.Topology != key.Topology {
			s.flagged, s.cost = false, 0
			continue
		}
		delete(flagged, key.rank)
		a.setStraggler(now, s, f)
	}
	for _, f := range flagged {
		key := rankKey{job: res.Job, rank: f.Rank, Topology: f.Topology}
		s := lookup(a, a.stragglers, key, func() *rankStraggler {
			return &rankStraggler{start: pcommon.NewTimestampFromTime(now)}
		})
		if s != nil {
			a.setStraggler(now, s, f)
		}
	}
	active := make(map[diagnosis.Suspect]*diagnosis.SuspectFlag, len(res.Suspects))
	for i := range res.Suspects {
		active[res.Suspects[i].Suspect] = &res.Suspects[i]
	}
	for key, g := range a.suspects {
		if key.job != res.Job {
			continue
		}
		if f := active[key.Suspect]; f != nil {
			g.active, g.cost, g.updated = true, f.Cost, now
			delete(active, key.Suspect)
		} else {
			g.active, g.cost = false, 0
		}
	}
	for s, f := range active {
		if g := lookup(a, a.suspects, suspectKey{job: res.Job, Suspect: s},
			func() *suspectGauge { return &suspectGauge{} }); g != nil {
			g.active, g.cost, g.updated = true, f.Cost, now
		}
	}
}

// replayErrorAlpha is the weight of a step in the replay error's moving average.
const replayErrorAlpha = 0.2

// attributionAlpha is the weight of a step in the attribution's moving averages: about the
// flag window's worth of steps (diagnosis' costAlpha at the default window).
const attributionAlpha = 2.0 / 9

// observeAttribution moves each kind of work's saving for the job toward this step's (0 for
// a kind the step does not name).
func (a *aggregator) observeAttribution(now time.Time, res *diagnosis.StepResult) {
	saves := make(map[string]float64, len(res.Attribution))
	for _, sv := range res.Attribution {
		saves[sv.Kind] += sv.Saves
	}
	for key, g := range a.attribution {
		if key.job != res.Job {
			continue
		}
		g.saves += attributionAlpha * (saves[key.kind] - g.saves)
		g.updated = now
		delete(saves, key.kind)
	}
	for kind, v := range saves {
		if g := lookup(a, a.attribution, attributionKey{job: res.Job, kind: kind},
			func() *attributionGauge { return &attributionGauge{} }); g != nil {
			g.saves, g.updated = attributionAlpha*v, now
		}
	}
}

// observeGroups moves each group's phase toward this step's. A group absent from a step
// keeps its figures until its series idles out.
func (a *aggregator) observeGroups(now time.Time, res *diagnosis.StepResult) {
	for _, gp := range res.Groups {
		created := false
		g := lookup(a, a.groups, groupKey{job: res.Job, pg: gp.PG, op: gp.Op,
			switches: gp.Switches, hosts: gp.Hosts},
			func() *groupGauge { created = true; return &groupGauge{} })
		if g == nil {
			continue
		}
		if created {
			g.start, g.duration = gp.Start, gp.Duration
		} else {
			g.start += attributionAlpha * (gp.Start - g.start)
			g.duration += attributionAlpha * (gp.Duration - g.duration)
		}
		g.updated = now
	}
}

// observeImbalances sets the job's imbalance flags and costs after one step: the flagged
// ones active with their cost, the others inactive at 0.
func (a *aggregator) observeImbalances(now time.Time, res *diagnosis.StepResult) {
	active := make(map[imbalanceKey]*diagnosis.ImbalanceFlag, len(res.Imbalances))
	for i := range res.Imbalances {
		im := &res.Imbalances[i]
		active[imbalanceKey{job: res.Job, cause: im.Cause, stage: im.Stage}] = im
	}
	for key, g := range a.imbalances {
		if key.job != res.Job {
			continue
		}
		if im := active[key]; im != nil {
			g.active, g.cost, g.updated = true, im.Cost, now
			delete(active, key)
		} else {
			g.active, g.cost = false, 0
		}
	}
	for key, im := range active {
		if g := lookup(a, a.imbalances, key, func() *imbalanceGauge {
			return &imbalanceGauge{}
		}); g != nil {
			g.active, g.cost, g.updated = true, im.Cost, now
		}
	}
}

func (a *aggregator) setStraggler(now time.Time, s *rankStraggler, f *diagnosis.RankFlag) {
	s.updated = now
	s.flagged = true
	s.cost = f.Cost
	s.cause = f.Cause
	if s.cause == "" {
		s.cause = semconv.CauseUnknown
	}
	if !containsString(s.causes, s.cause) {
		s.causes = append(s.causes, s.cause)
	}
}

func (a *aggregator) observeStep(now time.Time, rank rankKey, duration float64, ref spanRef) {
	a.now = now
	a.observe(lookup(a, a.stepDuration, rank, func() *histogram { return a.newHistogram(now) }),
		now, duration, ref)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// expire forgets series not updated within series_idle_timeout.
func (a *aggregator) expire(now time.Time) {
	cutoff := now.Add(-a.cfg.SeriesIdleTimeout)
	expireMap(a.skew, cutoff, func(h *histogram) time.Time { return h.updated })
	expireMap(a.transfer, cutoff, func(h *histogram) time.Time { return h.updated })
	expireMap(a.lateness, cutoff, func(h *histogram) time.Time { return h.updated })
	expireMap(a.wait, cutoff, func(h *histogram) time.Time { return h.updated })
	expireMap(a.stepDuration, cutoff, func(h *histogram) time.Time { return h.updated })
	expireMap(a.stragglers, cutoff, func(s *rankStraggler) time.Time { return s.updated })
	expireMap(a.suspects, cutoff, func(g *suspectGauge) time.Time { return g.updated })
	expireMap(a.jobs, cutoff, func(g *jobGauge) time.Time { return g.updated })
	expireMap(a.imbalances, cutoff, func(g *imbalanceGauge) time.Time { return g.updated })
	expireMap(a.attribution, cutoff, func(g *attributionGauge) time.Time { return g.updated })
	expireMap(a.groups, cutoff, func(g *groupGauge) time.Time { return g.updated })
	for job, js := range a.byJob {
		if js.lastUsed.Before(cutoff) {
			delete(a.byJob, job)
		}
	}
	expireMap(a.incomplete, cutoff, func(c *incompleteCounter) time.Time { return c.updated })
	expireMap(a.missing, cutoff, func(c *incompleteCounter) time.Time { return c.updated })
	expireMap(a.offsets, cutoff, func(g *offsetGauge) time.Time { return g.updated })
}

func expireMap[K comparable, V any](m map[K]*V, cutoff time.Time, updated func(*V) time.Time) {
	for k, v := range m {
		if updated(v).Before(cutoff) {
			delete(m, k)
		}
	}
}

func putRank(attrs pcommon.Map, k rankKey) {
	attrs.PutStr(semconv.AttrJobID, k.job)
	attrs.PutInt(semconv.AttrRank, int64(k.rank))
	attrs.PutStr(semconv.AttrHostName, k.Host)
	attrs.PutStr(semconv.AttrSwitch, k.Switch)
	attrs.PutStr(semconv.AttrNIC, k.NIC)
}

func putSuspect(attrs pcommon.Map, k suspectKey) {
	attrs.PutStr(semconv.AttrJobID, k.job)
	attrs.PutStr(semconv.AttrSuspectKind, k.Kind.String())
	attrs.PutStr(semconv.AttrSuspectName, k.Name)
	attrs.PutStr(semconv.AttrHostName, k.Host)
}

func putCollective(attrs pcommon.Map, k collectiveKey) {
	attrs.PutStr(semconv.AttrJobID, k.job)
	attrs.PutStr(semconv.AttrCollectivePG, k.pg)
	attrs.PutStr(semconv.AttrCollectiveOp, k.op)
}

// build emits the series as cumulative metrics, then drops the exemplars it emitted: the
// gauges and counters every time, the histograms when observed since they were last emitted
// and all of them every metrics_resend_interval (cumulative points: one left out repeats the
// last one emitted, which the Prometheus exporter and the pacer keep).
func (a *aggregator) build(now time.Time) pmetric.Metrics {
	a.expire(now)
	ts := pcommon.NewTimestampFromTime(now)
	md := pmetric.NewMetrics()
	sm := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty()
	sm.Scope().SetName(scopeName)
	metrics := sm.Metrics()
	all := a.lastFull.IsZero() || !now.Before(a.lastFull.Add(a.cfg.MetricsResendInterval))
	if all {
		a.lastFull = now
	}

	buildHistograms(a, metrics, semconv.MetricBarrierSkew, a.skew, ts, all,
		putCollective)
	buildHistograms(a, metrics, semconv.MetricCollectiveTransfer, a.transfer, ts, all,
		putCollective)
	buildHistograms(a, metrics, semconv.MetricRankLateness, a.lateness, ts, all,
		putRank)
	buildHistograms(a, metrics, semconv.MetricRankWait, a.wait, ts, all,
		putRank)
	buildHistograms(a, metrics, semconv.MetricStepDuration, a.stepDuration, ts, all, putRank)

	if len(a.stragglers) > 0 {
		m := appendMetric(metrics, semconv.MetricStraggler)
		points := m.SetEmptyGauge().DataPoints()
		for _, key := range sortedKeys(a.stragglers, lessRank) {
			s := a.stragglers[key]
			if len(s.causes) == 0 {
				dp := points.AppendEmpty()
				putRank(dp.Attributes(), key)
				dp.SetTimestamp(ts)
				dp.SetIntValue(0)
				continue
			}
			for _, cause := range s.causes {
				dp := points.AppendEmpty()
				putRank(dp.Attributes(), key)
				dp.Attributes().PutStr(semconv.AttrStragglerCause, cause)
				dp.SetTimestamp(ts)
				dp.SetIntValue(gaugeFlag(s.flagged && s.cause == cause))
			}
		}
	}
	if len(a.stragglers) > 0 {
		m := appendMetric(metrics, semconv.MetricRankCost)
		points := m.SetEmptyGauge().DataPoints()
		for _, key := range sortedKeys(a.stragglers, lessRank) {
			dp := points.AppendEmpty()
			putRank(dp.Attributes(), key)
			dp.SetTimestamp(ts)
			dp.SetDoubleValue(a.stragglers[key].cost)
		}
	}
	if len(a.suspects) > 0 {
		flags := appendMetric(metrics, semconv.MetricFabricSuspect)
		costs := appendMetric(metrics, semconv.MetricFabricCost)
		flagPoints := flags.SetEmptyGauge().DataPoints()
		costPoints := costs.SetEmptyGauge().DataPoints()
		for _, key := range sortedKeys(a.suspects, func(x, y suspectKey) bool {
			return x.job+"\x00"+x.ID() < y.job+"\x00"+y.ID()
		}) {
			g := a.suspects[key]
			dp := flagPoints.AppendEmpty()
			putSuspect(dp.Attributes(), key)
			dp.SetTimestamp(ts)
			dp.SetIntValue(gaugeFlag(g.active))
			cp := costPoints.AppendEmpty()
			putSuspect(cp.Attributes(), key)
			cp.SetTimestamp(ts)
			cp.SetDoubleValue(g.cost)
		}
	}
	if len(a.jobs) > 0 {
		m := appendMetric(metrics, semconv.MetricJobSlowdown)
		points := m.SetEmptyGauge().DataPoints()
		for _, job := range sortedKeys(a.jobs, func(x, y jobName) bool { return x < y }) {
			dp := points.AppendEmpty()
			dp.Attributes().PutStr(semconv.AttrJobID, string(job))
			dp.SetTimestamp(ts)
			dp.SetDoubleValue(a.jobs[job].slowdown)
		}
	}
	if checked := jobsChecked(a.jobs); len(checked) > 0 {
		m := appendMetric(metrics, semconv.MetricReplayError)
		points := m.SetEmptyGauge().DataPoints()
		for _, job := range checked {
			dp := points.AppendEmpty()
			dp.Attributes().PutStr(semconv.AttrJobID, string(job))
			dp.SetTimestamp(ts)
			dp.SetDoubleValue(a.jobs[job].replayError)
		}
	}
	if len(a.attribution) > 0 {
		m := appendMetric(metrics, semconv.MetricAttribution)
		points := m.SetEmptyGauge().DataPoints()
		for _, key := range sortedKeys(a.attribution, func(x, y attributionKey) bool {
			if x.job != y.job {
				return x.job < y.job
			}
			return x.kind < y.kind
		}) {
			dp := points.AppendEmpty()
			dp.Attributes().PutStr(semconv.AttrJobID, key.job)
			dp.Attributes().PutStr(semconv.AttrAttributionKind, key.kind)
			dp.SetTimestamp(ts)
			dp.SetDoubleValue(a.attribution[key].saves)
		}
	}
	if len(a.groups) > 0 {
		starts := appendMetric(metrics, semconv.MetricGroupPhaseStart).SetEmptyGauge().DataPoints()
		durations := appendMetric(metrics, semconv.MetricGroupPhaseDuration).SetEmptyGauge().
			DataPoints()
		for _, key := range sortedKeys(a.groups, func(x, y groupKey) bool {
			if x.job != y.job {
				return x.job < y.job
			}
			if x.pg != y.pg {
				return x.pg < y.pg
			}
			if x.op != y.op {
				return x.op < y.op
			}
			if x.switches != y.switches {
				return x.switches < y.switches
			}
			return x.hosts < y.hosts
		}) {
			g := a.groups[key]
			for _, pt := range []struct {
				points pmetric.NumberDataPointSlice
				value  float64
			}{{starts, g.start}, {durations, g.duration}} {
				dp := pt.points.AppendEmpty()
				dp.Attributes().PutStr(semconv.AttrJobID, key.job)
				dp.Attributes().PutStr(semconv.AttrCollectivePG, key.pg)
				dp.Attributes().PutStr(semconv.AttrCollectiveOp, key.op)
				dp.Attributes().PutStr(semconv.AttrGroupSwitches, key.switches)
				dp.Attributes().PutStr(semconv.AttrGroupHosts, key.hosts)
				dp.SetTimestamp(ts)
				dp.SetDoubleValue(pt.value)
			}
		}
	}
	if len(a.imbalances) > 0 {
		flags := appendMetric(metrics, semconv.MetricImbalance)
		costs := appendMetric(metrics, semconv.MetricImbalanceCost)
		flagPoints := flags.SetEmptyGauge().DataPoints()
		costPoints := costs.SetEmptyGauge().DataPoints()
		for _, key := range sortedKeys(a.imbalances, func(x, y imbalanceKey) bool {
			if x.job != y.job {
				return x.job < y.job
			}
			if x.cause != y.cause {
				return x.cause < y.cause
			}
			return x.stage < y.stage
		}) {
			g := a.imbalances[key]
			for _, pt := range []struct {
				dp   pmetric.NumberDataPoint
				cost bool
			}{{flagPoints.AppendEmpty(), false}, {costPoints.AppendEmpty(), true}} {
				attrs := pt.dp.Attributes()
				attrs.PutStr(semconv.AttrJobID, key.job)
				attrs.PutStr(semconv.AttrStragglerCause, key.cause)
				attrs.PutInt(semconv.AttrPipelineStage, int64(key.stage))
				pt.dp.SetTimestamp(ts)
				if pt.cost {
					pt.dp.SetDoubleValue(g.cost)
				} else {
					pt.dp.SetIntValue(gaugeFlag(g.active))
				}
			}
		}
	}
	if len(a.incomplete) > 0 {
		m := appendMetric(metrics, semconv.MetricCollectiveIncomplete)
		sum := m.SetEmptySum()
		sum.SetIsMonotonic(true)
		sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		for _, key := range sortedKeys(a.incomplete, lessCollective) {
			c := a.incomplete[key]
			dp := sum.DataPoints().AppendEmpty()
			putCollective(dp.Attributes(), key)
			dp.SetStartTimestamp(c.start)
			dp.SetTimestamp(ts)
			dp.SetIntValue(c.count)
		}
	}
	if len(a.missing) > 0 {
		m := appendMetric(metrics, semconv.MetricRankMissing)
		sum := m.SetEmptySum()
		sum.SetIsMonotonic(true)
		sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		for _, key := range sortedKeys(a.missing, func(x, y missingKey) bool {
			if x.job != y.job {
				return x.job < y.job
			}
			return x.rank < y.rank
		}) {
			c := a.missing[key]
			dp := sum.DataPoints().AppendEmpty()
			dp.Attributes().PutStr(semconv.AttrJobID, key.job)
			dp.Attributes().PutInt(semconv.AttrRank, int64(key.rank))
			dp.SetStartTimestamp(c.start)
			dp.SetTimestamp(ts)
			dp.SetIntValue(c.count)
		}
	}
	if len(a.offsets) > 0 {
		m := appendMetric(metrics, semconv.MetricClockOffset)
		points := m.SetEmptyGauge().DataPoints()
		for _, key := range sortedKeys(a.offsets, func(x, y hostKey) bool {
			return x.job+"\x00"+x.host < y.job+"\x00"+y.host
		}) {
			dp := points.AppendEmpty()
			dp.Attributes().PutStr(semconv.AttrJobID, key.job)
			dp.Attributes().PutStr(semconv.AttrHostName, key.host)
			dp.SetTimestamp(ts)
			dp.SetDoubleValue(a.offsets[key].value)
		}
	}
	return md
}

// jobsChecked lists the jobs whose replay was self-checked, in order.
func jobsChecked(jobs map[jobName]*jobGauge) []jobName {
	var out []jobName
	for _, job := range sortedKeys(jobs, func(x, y jobName) bool { return x < y }) {
		if jobs[job].replayError >= 0 {
			out = append(out, job)
		}
	}
	return out
}

// appendMetric appends a metric with its name, unit and description from the registry
// (semconv.Metrics): none is written here.
func appendMetric(metrics pmetric.MetricSlice, name string) pmetric.Metric {
	m := metrics.AppendEmpty()
	spec := semconv.Metrics[name]
	m.SetName(name)
	m.SetDescription(spec.Description)
	m.SetUnit(spec.Unit)
	return m
}

func buildHistograms[K comparable](a *aggregator, metrics pmetric.MetricSlice, name string,
	series map[K]*histogram, ts pcommon.Timestamp, all bool, putAttrs func(pcommon.Map, K),
) {
	emit := len(series)
	if !all {
		emit = 0
		for _, h := range series {
			if h.dirty {
				emit++
			}
		}
	}
	if emit == 0 {
		return
	}
	m := appendMetric(metrics, name)
	hist := m.SetEmptyHistogram()
	hist.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	points := hist.DataPoints()
	points.EnsureCapacity(emit)
	for key, h := range series {
		if !all && !h.dirty {
			continue
		}
		h.dirty = false
		dp := points.AppendEmpty()
		putAttrs(dp.Attributes(), key)
		dp.SetStartTimestamp(h.start)
		dp.SetTimestamp(ts)
		dp.SetCount(h.count)
		dp.SetSum(h.sum)
		dp.ExplicitBounds().FromRaw(a.cfg.HistogramBuckets)
		dp.BucketCounts().FromRaw(h.counts)
		for _, ex := range h.exemplars {
			e := dp.Exemplars().AppendEmpty()
			e.SetTraceID(ex.traceID)
			e.SetSpanID(ex.spanID)
			e.SetDoubleValue(ex.value)
			e.SetTimestamp(ex.time)
		}
		h.exemplars = h.exemplars[:0]
		h.nextEx = 0
	}
}

func sortedKeys[K comparable, V any](m map[K]V, less func(K, K) bool) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return less(keys[i], keys[j]) })
	return keys
}

func lessRank(x, y rankKey) bool {
	if x.job != y.job {
		return x.job < y.job
	}
	if x.rank != y.rank {
		return x.rank < y.rank
	}
	return x.Host+x.Switch+x.NIC < y.Host+y.Switch+y.NIC
}

func lessCollective(x, y collectiveKey) bool {
	return x.job+"\x00"+x.pg+"\x00"+x.op < y.job+"\x00"+y.pg+"\x00"+y.op
}

// gaugeFlag is a 0/1 gauge value.
func gaugeFlag(on bool) int64 {
	if on {
		return 1
	}
	return 0
}
