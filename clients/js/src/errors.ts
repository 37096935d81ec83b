/**
 * The client's error tree. Every error is a {@link TicketingError}; those that stand for a
 * server status carry it in `.status` (with `.code`, its name) and `.detail`.
 *
 * ```
 * TicketingError
 * ├── NotAcquiredError        TIMED_OUT: the wait timeout passed (or tryAcquire found it taken)
 * ├── NotHeldError            NOT_HELD: the token is not the key's holder; nothing changed
 * ├── LockLostError           the lost signal: EXPIRED notice, local deadline, NOT_HELD on extend
 * ├── InvalidRequestError     INVALID, with .field
 * ├── NotLeaderError          NOT_LEADER, with .leader
 * ├── BusyError               BUSY, with .limit
 * ├── ShuttingDownError       SHUTTING_DOWN
 * ├── AuthFailedError         AUTH_FAILED, or the server failed to prove it holds the token
 * ├── UnsupportedVersionError UNSUPPORTED_VERSION
 * ├── CancelledError          CANCELLED (name "AbortError")
 * ├── ConnectionLostError     the connection dropped (or never came up) before the answer
 * │   └── ClientClosedError   the client was closed (or destroyed)
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
  cause?: unknown;
}

/** The base of every error this client throws. */
export class TicketingError extends Error {
  override name = 'TicketingError';
  /** The server's status code, when the error is a server answer. */
  readonly status: number | undefined;
  /** The status name (`NOT_HELD`), or a local code (`CONNECTION_LOST`, `CLIENT_CLOSED`, `PROTOCOL`). */
  readonly code: string;
  /** The response's `detail` field: the field code of INVALID, the limit code of BUSY; else 0. */
  readonly detail: number;

  constructor(message: string, options: TicketingErrorOptions & { code?: string } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.status = options.status;
    this.detail = options.detail ?? 0;
    this.code = options.code ?? (options.status === undefined ? 'TICKETING' : statusName(options.status));
  }
}

/** TIMED_OUT: the lock was not acquired within the wait timeout (or, for tryAcquire, it was taken). Nothing is held. */
export class NotAcquiredError extends TicketingError {
  override name = 'NotAcquiredError';
  constructor(message = 'lock not acquired: the wait timeout passed', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.TIMED_OUT, ...options });
  }
}

/** NOT_HELD: the token is not the key's current holder (expired, released, wrong); nothing changed. Never retry. */
export class NotHeldError extends TicketingError {
  override name = 'NotHeldError';
  constructor(message = 'lock not held: the token is not the current holder', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.NOT_HELD, ...options });
  }
}

/** Why a lock was lost. */
export type LostReason = 'expired' | 'deadline' | 'not-held';

/** The lost signal: the lock's lease ran out (server notice or local deadline) or the server no longer knows the token. */
export class LockLostError extends TicketingError {
  override name = 'LockLostError';
  constructor(
    message: string,
    /** `expired`: the server's EXPIRED notice; `deadline`: the local deadline passed; `not-held`: EXTEND answered NOT_HELD. */
    readonly reason: LostReason,
    options: TicketingErrorOptions = {},
  ) {
    super(message, { code: 'LOCK_LOST', ...options });
  }
}

/** INVALID: the server rejected the request; `.field` says which field. Do not retry unchanged. */
export class InvalidRequestError extends TicketingError {
  override name = 'InvalidRequestError';
  /** The field code (see `Field`). */
  readonly field: number;
  /** The field's name (`KEY`, `LEASE`, ...). */
  readonly fieldName: string;
  constructor(message: string, field: number, options: TicketingErrorOptions = {}) {
    super(message, { status: Status.INVALID, detail: field, ...options });
    this.field = field;
    this.fieldName = fieldName(field);
  }
}

/** NOT_LEADER: this cluster node is not the leader; `.leader` is the leader's address, or `''` when unknown. */
export class NotLeaderError extends TicketingError {
  override name = 'NotLeaderError';
  constructor(
    message: string,
    readonly leader: string,
    options: TicketingErrorOptions = {},
  ) {
    super(message, { status: Status.NOT_LEADER, ...options });
  }
}

/** BUSY: a server limit was reached; `.limit` says which. Retry later with backoff. */
export class BusyError extends TicketingError {
  override name = 'BusyError';
  /** The limit code (see `Limit`). */
  readonly limit: number;
  /** The limit's name (`WAITERS_PER_KEY`, ...). */
  readonly limitName: string;
  constructor(message: string, limit: number, options: TicketingErrorOptions = {}) {
    super(message, { status: Status.BUSY, detail: limit, ...options });
    this.limit = limit;
    this.limitName = limitName(limit);
  }
}

/** SHUTTING_DOWN: the server is stopping. */
export class ShuttingDownError extends TicketingError {
  override name = 'ShuttingDownError';
  constructor(message = 'the server is shutting down', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.SHUTTING_DOWN, ...options });
  }
}

/** AUTH_FAILED, or a server that could not prove it holds the token. Do not retry with the same token. */
export class AuthFailedError extends TicketingError {
  override name = 'AuthFailedError';
  constructor(message = 'authentication failed', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.AUTH_FAILED, ...options });
  }
}

/** UNSUPPORTED_VERSION: the server does not speak this client's protocol version. */
export class UnsupportedVersionError extends TicketingError {
  override name = 'UnsupportedVersionError';
  constructor(
    message: string,
    /** The server's protocol version, from its CHALLENGE. */
    readonly serverVersion: number,
    options: TicketingErrorOptions = {},
  ) {
    super(message, { status: Status.UNSUPPORTED_VERSION, ...options });
  }
}

/** CANCELLED: the acquire was withdrawn. Its `name` is `AbortError`, like other cancellations in Node. */
export class CancelledError extends TicketingError {
  override name = 'AbortError';
  constructor(message = 'the acquire was cancelled', options: TicketingErrorOptions = {}) {
    super(message, { status: Status.CANCELLED, ...options });
  }
}

/** The connection dropped (or could not be made) before the answer came. Locks held stay held until their lease ends. */
export class ConnectionLostError extends TicketingError {
  override name = 'ConnectionLostError';
  constructor(message = 'connection lost', options: TicketingErrorOptions & { code?: string } = {}) {
    super(message, { code: 'CONNECTION_LOST', ...options });
  }
}

/** The client was closed (or destroyed) before or while the call ran. A request in flight has an unknown outcome, as with {@link ConnectionLostError}. */
export class ClientClosedError extends ConnectionLostError {
  override name = 'ClientClosedError';
  constructor(message = 'the client is closed', options: TicketingErrorOptions = {}) {
    super(message, { code: 'CLIENT_CLOSED', ...options });
  }
}

/** The server sent bytes that break the protocol; the connection is closed. */
export class ProtocolError extends TicketingError {
  override name = 'ProtocolError';
  constructor(message: string, options: TicketingErrorOptions = {}) {
    super(message, { code: 'PROTOCOL', ...options });
  }
}

/**
 * The error for a non-OK server answer. `what` names the request (`acquire "order-1"`); `data`
 * is the response's data (a message, or the leader's address for NOT_LEADER); `cause` is set as
 * the error's cause.
 */
export function errorForStatus(status: number, detail: number, data: Uint8Array, what: string, cause?: unknown): TicketingError {
  const text = Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString('utf8');
  const why = text ? `: ${text}` : '';
  const o: TicketingErrorOptions = cause === undefined ? { detail } : { detail, cause };
  switch (status) {
    case Status.TIMED_OUT:
      return new NotAcquiredError(`${what}: not acquired (timed out)${why}`, o);
    case Status.NOT_HELD:
      return new NotHeldError(`${what}: lock not held${why}`, o);
    case Status.INVALID:
      return new InvalidRequestError(`${what}: invalid ${fieldName(detail)}${why}`, detail, o);
    case Status.NOT_LEADER:
      return new NotLeaderError(`${what}: not the leader${text ? `; leader is ${text}` : ''}`, text, o);
    case Status.BUSY:
      return new BusyError(`${what}: server busy (${limitName(detail)})${why}`, detail, o);
    case Status.SHUTTING_DOWN:
      return new ShuttingDownError(`${what}: server shutting down${why}`, o);
    case Status.AUTH_FAILED:
      return new AuthFailedError(`${what}: authentication failed${why}`, o);
    case Status.UNSUPPORTED_VERSION:
      return new UnsupportedVersionError(`${what}: unsupported protocol version${why}`, 0, o);
    case Status.CANCELLED:
      return new CancelledError(`${what}: cancelled${why}`, o);
    default:
      return new TicketingError(`${what}: server answered status ${status}${why}`, { status, ...o });
  }
}
