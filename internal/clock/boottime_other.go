//go:build !linux

package clock

func boottime() int64 { return monotonic() }
