/**
 * The official JavaScript/TypeScript client of Ticketing, the distributed lock server.
 *
 * ```ts
 * import { createClient } from '@ticketing/client';
 *
 * const client = await createClient({ endpoints: ['127.0.0.1:7070'] }).connect();
 * await using lock = await client.acquire('order-1234', { lease: 10_000, waitTimeout: 5_000 });
 * console.log('holding', lock.key, 'with fencing token', lock.token);
 * ```
 *
 * @module
 */
export {
  Client,
  createClient,
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_ENDPOINT,
  DEFAULT_LEASE_MS,
  type AcquireOptions,
  type ClientOptions,
  type InspectOptions,
  type KeyInfo,
} from './client.js';
export { Lock, type Key } from './lock.js';
export {
  AuthFailedError,
  BusyError,
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  InvalidRequestError,
  LockLostError,
  NotAcquiredError,
  NotHeldError,
  NotLeaderError,
  ProtocolError,
  ShuttingDownError,
  TicketingError,
  UnsupportedVersionError,
  errorForStatus,
  type LostReason,
  type TicketingErrorOptions,
} from './errors.js';
export { Field, Limit, Op, Sizes, Status, VERSION, WAIT_FOREVER } from './protocol.js';
