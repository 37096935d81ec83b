/**
 * The wire format of Ticketing protocol version 1 ({@code PROTOCOL.md}): code tables, frame
 * encoding and decoding, and the handshake's authentication proofs. Applications use
 * {@link io.ticketing.TicketingClient}; this package is for tools and tests that speak the
 * protocol directly. All integers are big-endian; 64-bit ids and tokens are unsigned values held in
 * {@code long}, 32-bit fields are held in {@code long} as well.
 */
package io.ticketing.protocol;
