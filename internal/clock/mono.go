package clock

import "time"

var origin = time.Now()

// monotonic is the process's monotonic clock, offset so that it is never zero.
func monotonic() int64 { return int64(time.Since(origin)) + 1 }
