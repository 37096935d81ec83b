/**
 * The client's error tree. Every error is a {@link TicketingError}; those that stand for a
 * server status carry it in `.status` (with `.code`, its name) and `.detail`; the others have a
 * local `.code`.
 *
 * ```
 * TicketingError
 * ├── NotAcquiredError        TIMED_OUT: the wait timeout passed (or the key was taken)
 * ├── CancelledError          the caller aborted the call, or CANCELLED (name "AbortError")
 * ├── NotHeldError            NOT_HELD to a release/extend by key and token; nothing changed
 * ├── LockLostError           an operation on a lock that is lost; .reason
 * ├── InvalidArgumentError    rejected before anything was sent
 * │   └── InvalidRequestError INVALID from the server, with .field
 * ├── AlreadyHeldError        refuseHeld: this client already holds the key
 * ├── AuthFailedError         wrong token, a token required, or a server proof that did not verify
 * ├── UnsupportedVersionError UNSUPPORTED_VERSION
 * ├── UnavailableError        no endpoint could be connected to (refused, not the leader, ...)
 * ├── TlsError                the TLS handshake failed (or TLS met plaintext)
 * ├── TimeoutError            no answer within the request timeout (a frozen or half-open server)
 * ├── ConnectionLostError     the connection dropped and the session could not be resumed
 * ├── ServerRestartedError    the server's state id changed while the call was in flight
 * ├── BusyError               BUSY, with .limit
 * ├── ShuttingDownError       SHUTTING_DOWN
 * ├── NotLeaderError          NOT_LEADER after every redirect was followed
 * ├── ClientClosedError       the client was closed (or destroyed)
 * └── ProtocolError           the server broke the protocol
 * ```
 *
 * @module
 */
import { Status, fieldName, limitName, statusName } from './protocol.js';

/** Options common to every {@link TicketingError}. */
export interface TicketingErrorOptions {
  /** The server status this error stands for. */
  status?: number;
  /** The response's `detail` (field code, limit code). */
  detail?: number;
  /** The underlying error. */
  cause?: unknown;
}

/** The base of every error this client throws. */
export class TicketingError extends Error {
  override name = 'TicketingError';
  /** The server's status code, when the error is a server answer. */
  readonly status: number | undefined;
  /** The status name (`NOT_HELD`), or a local code (`TIMEOUT`, `CONNECTION_LOST`, `CLIENT_CLOSED`, ...). */
  readonly code: string;
  /** The response's `detail` field: the field code of INVALID, the limit code of BUSY; else 0. */
  readonly detail: number;

  /**
   * @param message - one line, with context (key, token, timeout, endpoint).
   * @param options - status, detail, cause, and a local code.
   */
  constructor(message: string, options: TicketingErrorOptions & { code?: string } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.status = options.status;
    this.detail = options.detail ?? 0;
    this.code = options.code ?? (options.status === undefined ? 'TICKETING' : statusName(options.status));
  }
}

/** TIMED_OUT: the lock was not acquired within the wait timeout (or a try found it taken). Nothing is held. */
export class NotAcquiredError extends TicketingError {
  override name = 'NotAcquiredError';
  /** @param message - what was not acquired. */
  constructor(message = 'lock not acquired: the wait timeout passed', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.TIMED_OUT, ...options });
  }
}

/**
 * The call was cancelled: its `AbortSignal` aborted (the signal's reason is the `cause`), the
 * client closed while it waited, or the server answered CANCELLED. Its `name` is `AbortError`,
 * like every cancellation in Node. A cancelled acquire leaves nothing held.
 */
export class CancelledError extends TicketingError {
  override name = 'AbortError';
  /** @param message - what was cancelled. */
  constructor(message = 'the call was cancelled', options: TicketingErrorOptions = {}) {
    super(message, { code: 'CANCELLED', ...options });
  }
}

/** NOT_HELD to a release or extend by key and token: the token is not the key's current holder (expired, released, wrong); nothing changed. Never retry. */
export class NotHeldError extends TicketingError {
  override name = 'NotHeldError';
  /** @param message - which key and token. */
  constructor(message = 'lock not held: the token is not the current holder', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.NOT_HELD, ...options });
  }
}

/**
 * Why a lock was lost, the same names in every Ticketing client:
 * - `expired`: its lease ran out (the local deadline, or the server's EXPIRED notice);
 * - `not held`: the server answered NOT_HELD to an extend or release of it;
 * - `server restarted`: the client reconnected to a server with another state id (its locks are gone);
 * - `server stopping`: the server is stopping (EXPIRED with reason STOPPING).
 */
export type LostReason = 'expired' | 'not held' | 'server restarted' | 'server stopping';

/** The lock is lost (see {@link LostReason}); the operation on it did not succeed. */
export class LockLostError extends TicketingError {
  override name = 'LockLostError';
  /**
   * @param message - which lock, and why.
   * @param reason - why it was lost.
   */
  constructor(
    message: string,
    readonly reason: LostReason,
    options: TicketingErrorOptions = {},
  ) {
    super(message, { code: 'LOCK_LOST', ...options });
  }
}

/** An argument was rejected before anything was sent (a bad key, lease, wait timeout, token, option). */
export class InvalidArgumentError extends TicketingError {
  override name = 'InvalidArgumentError';
  /** @param message - which argument, what was given, what was expected. */
  constructor(message: string, options: TicketingErrorOptions & { code?: string } = {}) {
    super(message, { code: 'INVALID_ARGUMENT', ...options });
  }
}

/** INVALID: the server rejected the request; `.field` says which field. Do not retry unchanged. */
export class InvalidRequestError extends InvalidArgumentError {
  override name = 'InvalidRequestError';
  /** The field code (see `Field`). */
  readonly field: number;
  /** The field's name (`KEY`, `LEASE`, ...). */
  readonly fieldName: string;
  /** @param field - the field code from the answer's detail. */
  constructor(message: string, field: number, options: TicketingErrorOptions = {}) {
    super(message, { status: Status.INVALID, detail: field, code: 'INVALID', ...options });
    this.field = field;
    this.fieldName = fieldName(field);
  }
}

/** `refuseHeld` was set and this client already holds the key: acquiring it would queue behind itself. */
export class AlreadyHeldError extends TicketingError {
  override name = 'AlreadyHeldError';
  /** @param message - which key, and the token held. */
  constructor(message: string, options: TicketingErrorOptions = {}) {
    super(message, { code: 'ALREADY_HELD', ...options });
  }
}

/** AUTH_FAILED, a server that requires a token the client lacks, or a server that could not prove it holds the token. Do not retry with the same token. */
export class AuthFailedError extends TicketingError {
  override name = 'AuthFailedError';
  /** @param message - which endpoint, and what failed. */
  constructor(message = 'authentication failed', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.AUTH_FAILED, ...options });
  }
}

/** UNSUPPORTED_VERSION: the server does not speak this client's protocol version. */
export class UnsupportedVersionError extends TicketingError {
  override name = 'UnsupportedVersionError';
  /** @param serverVersion - the server's protocol version, from its CHALLENGE (0 when unknown). */
  constructor(
    message: string,
    readonly serverVersion: number,
    options: TicketingErrorOptions = {},
  ) {
    super(message, { status: Status.UNSUPPORTED_VERSION, ...options });
  }
}

/**
 * No endpoint could be connected to: refused, unreachable, the connect timeout passed (TCP, TLS
 * or the handshake: a server that accepts but does not answer), the connection closed during the
 * handshake, or a node that is not the leader refused it (then the
 * `cause` is a {@link NotLeaderError} with its hint). While the client reconnects, such failures
 * are retried: calls wait, each bounded by its own timeout.
 */
export class UnavailableError extends TicketingError {
  override name = 'UnavailableError';
  /** @param message - the endpoints tried and the last failure. */
  constructor(message: string, options: TicketingErrorOptions = {}) {
    super(message, { code: 'UNAVAILABLE', ...options });
  }
}

/** The TLS handshake failed: a certificate was refused, or one side spoke TLS and the other plaintext. */
export class TlsError extends TicketingError {
  override name = 'TlsError';
  /** @param message - the endpoint and what failed, with a hint on a TLS/plaintext mismatch. */
  constructor(message: string, options: TicketingErrorOptions = {}) {
    super(message, { code: 'TLS', ...options });
  }
}

/**
 * No answer came within the request timeout (a frozen or unreachable server). For an acquire,
 * the client withdraws the request in the background and releases a grant that still arrives.
 */
export class TimeoutError extends TicketingError {
  override name = 'TimeoutError';
  /** @param message - what timed out, and after how long. */
  constructor(message: string, options: TicketingErrorOptions = {}) {
    super(message, { code: 'TIMEOUT', ...options });
  }
}

/**
 * The connection dropped and the session could not be resumed, so the answer will never come.
 * The request may or may not have run: an acquire may have been granted and runs out its lease.
 * Locks held stay held until their lease ends.
 */
export class ConnectionLostError extends TicketingError {
  override name = 'ConnectionLostError';
  /** @param message - what was in flight, and where. */
  constructor(message = 'connection lost', options: TicketingErrorOptions = {}) {
    super(message, { code: 'CONNECTION_LOST', ...options });
  }
}

/** The server restarted (its state id changed) while the call was in flight: every lock of this client is lost, and no request is re-sent. */
export class ServerRestartedError extends TicketingError {
  override name = 'ServerRestartedError';
  /** @param message - what was in flight, and where. */
  constructor(message = 'the server restarted', options: TicketingErrorOptions = {}) {
    super(message, { code: 'SERVER_RESTARTED', ...options });
  }
}

/** BUSY: a server limit was reached; `.limit` says which. Retry later with backoff. */
export class BusyError extends TicketingError {
  override name = 'BusyError';
  /** The limit code (see `Limit`). */
  readonly limit: number;
  /** The limit's name (`WAITERS_PER_KEY`, ...). */
  readonly limitName: string;
  /** @param limit - the limit code from the answer's detail. */
  constructor(message: string, limit: number, options: TicketingErrorOptions = {}) {
    super(message, { status: Status.BUSY, detail: limit, ...options });
    this.limit = limit;
    this.limitName = limitName(limit);
  }
}

/** SHUTTING_DOWN: the server is stopping. */
export class ShuttingDownError extends TicketingError {
  override name = 'ShuttingDownError';
  /** @param message - what was refused, and where. */
  constructor(message = 'the server is shutting down', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.SHUTTING_DOWN, ...options });
  }
}

/**
 * NOT_LEADER to a request, after the client followed every hint it was allowed to; `.leader` is
 * the last hint (`''` when unknown). A connect refused with NOT_LEADER is an
 * {@link UnavailableError} with this as its `cause`.
 */
export class NotLeaderError extends TicketingError {
  override name = 'NotLeaderError';
  /** @param leader - the leader's address from the answer, or `''`. */
  constructor(
    message: string,
    readonly leader: string,
    options: TicketingErrorOptions = {},
  ) {
    super(message, { status: Status.NOT_LEADER, ...options });
  }
}

/** The client was closed (or destroyed) before or while the call ran. A request in flight has an unknown outcome. */
export class ClientClosedError extends TicketingError {
  override name = 'ClientClosedError';
  /** @param message - what was refused or cut short. */
  constructor(message = 'the client is closed', options: TicketingErrorOptions = {}) {
    super(message, { code: 'CLIENT_CLOSED', ...options });
  }
}

/** The server sent bytes that break the protocol; the connection is closed. */
export class ProtocolError extends TicketingError {
  override name = 'ProtocolError';
  /** @param message - what was wrong, and from where. */
  constructor(message: string, options: TicketingErrorOptions = {}) {
    super(message, { code: 'PROTOCOL', ...options });
  }
}

/** A response's data (the server's message) as one line of text; `''` when empty. */
export function dataText(data: Uint8Array): string {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
    .toString('utf8')
    .replace(/\s*[\r\n]+\s*/g, ' ')
    .trim();
}

/**
 * The error for a non-OK server answer. `what` names the request (`acquire "order-1"`); `data`
 * is the response's data (a message, or the leader's address for NOT_LEADER).
 */
export function errorForStatus(status: number, detail: number, data: Uint8Array, what: string, cause?: unknown): TicketingError {
  const text = dataText(data);
  const why = text ? `: ${text}` : '';
  const o: TicketingErrorOptions = cause === undefined ? { detail } : { detail, cause };
  switch (status) {
    case Status.TIMED_OUT:
      return new NotAcquiredError(`${what}: not acquired (timed out)${why}`, o);
    case Status.NOT_HELD:
      return new NotHeldError(`${what}: not held${why}`, o);
    case Status.INVALID:
      return new InvalidRequestError(`${what}: invalid ${fieldName(detail)}${why}`, detail, o);
    case Status.NOT_LEADER:
      return new NotLeaderError(`${what}: not the leader${text ? `; leader is ${text}` : ''}`, text, o);
    case Status.BUSY:
      return new BusyError(`${what}: server busy (${limitName(detail)})${why}`, detail, o);
    case Status.SHUTTING_DOWN:
      return new ShuttingDownError(`${what}: the server is shutting down`, o);
    case Status.AUTH_FAILED:
      return new AuthFailedError(`${what}: authentication failed${why}`, o);
    case Status.UNSUPPORTED_VERSION:
      return new UnsupportedVersionError(`${what}: unsupported protocol version${why}`, 0, o);
    case Status.CANCELLED:
      return new CancelledError(`${what}: cancelled${why}`, { status, ...o });
    default:
      return new TicketingError(`${what}: server answered status ${status}${why}`, { status, ...o });
  }
}
