package ticketing

// sharedAddr is the address of the server that TestMain (main_test.go) starts for the whole
// test binary.
var sharedAddr string

// SetSharedServer tells the internal tests where the shared server listens.
func SetSharedServer(addr string) { sharedAddr = addr }
