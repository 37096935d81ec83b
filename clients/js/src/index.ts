/**
 * The official JavaScript/TypeScript client of Ticketing, the distributed lock server.
 *
 * ```ts
 * import { createClient } from '@ticketing/client';
 *
 * const client = await createClient({ endpoints: ['127.0.0.1:7070'] }).connect();
 * await using lock = await client.acquire('order-1234', { leaseMs: 10_000, waitTimeoutMs: 5_000 });
 * console.log('holding', lock.key, 'with fencing token', lock.token);
 * ```
 *
 * @module
 */
export {
  Client,
  createClient,
  DEFAULT_CLEANUP_TIMEOUT_MS,
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_ENDPOINT,
  DEFAULT_HEARTBEAT_INTERVAL_MS,
  DEFAULT_LEASE_MS,
  DEFAULT_MAX_RECONNECT_DELAY_MS,
  DEFAULT_MAX_REDIRECTS,
  DEFAULT_MIN_RECONNECT_DELAY_MS,
  DEFAULT_REQUEST_TIMEOUT_MS,
  type AcquireOptions,
  type ClientEvents,
  type ClientOptions,
  type ConnectOptions,
  type InspectOptions,
  type KeyInfo,
  type TryAcquireOptions,
} from './client.js';
export { CLOCK_RATE_FACTOR, Lock, localDeadline, lostMargin, type CallOptions } from './lock.js';
export type { Key } from './validate.js';
export {
  AlreadyHeldError,
  AuthFailedError,
  BusyError,
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  InvalidArgumentError,
  InvalidRequestError,
  LockLostError,
  NotAcquiredError,
  NotHeldError,
  NotLeaderError,
  ProtocolError,
  ServerRestartedError,
  ShuttingDownError,
  TicketingError,
  TimeoutError,
  TlsError,
  UnavailableError,
  UnsupportedVersionError,
  errorForStatus,
  type LostReason,
  type TicketingErrorOptions,
} from './errors.js';
export { ClientRules, ExpiredReason, Field, GoawayReason, InspectFlag, Limit, Op, Sizes, Status, VERSION, WAIT_FOREVER } from './protocol.js';
