package diagnosis

// VerifyTape makes every replay along a tape check itself against the replay without it
// (see verifiedTape) and returns a function that turns it off and returns how many it
// checked.
func VerifyTape() func() int {
	verifyTape = true
	before := tapesVerified
	return func() int {
		verifyTape = false
		return tapesVerified - before
	}
}

// TraceWhatIf makes whatIf report what it weighed through f (nil: stop).
func TraceWhatIf(f func(step int64, format string, args ...any)) { traceWhatIf = f }

// PartitionText is the fix text of a stage imbalance with an advised partition.
var PartitionText = partitionText
