//! Empty: this package only owns the client's tests (`../tests/it`) and example programs
//! (`../examples`); the library is the package `ticketing-client` in the folder above.
