// Unit tests of the protocol module against the repository's shared vectors and code tables
// (protocol/vectors.json, protocol/constants.json), read in place, never copied.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  Field,
  FrameError,
  FrameReader,
  Limit,
  Op,
  Sizes,
  Status,
  VERSION,
  clientProof,
  decodeAuth,
  decodeChallenge,
  decodeHello,
  decodeInspectData,
  decodeRequest,
  decodeResponse,
  decodeWelcome,
  encodeAuth,
  encodeChallenge,
  encodeHello,
  encodeRequest,
  encodeResponse,
  encodeWelcome,
  opName,
  proofEqual,
  serverProof,
  statusName,
} from '@ticketing/client/protocol';
import {
  AuthFailedError,
  BusyError,
  CancelledError,
  InvalidRequestError,
  NotAcquiredError,
  NotHeldError,
  NotLeaderError,
  ShuttingDownError,
  TicketingError,
  UnsupportedVersionError,
  errorForStatus,
} from '@ticketing/client';
import { hex, readJSON } from './helpers.js';

const vectors = readJSON('protocol/vectors.json');
const constants = readJSON('protocol/constants.json');

const opCode = (name: string): number => (name.startsWith('0x') ? parseInt(name, 16) : (Op as Record<string, number>)[name]!);
const statusCode = (name: string): number => (Status as Record<string, number>)[name]!;

describe('constants.json', () => {
  const tables: [string, Record<string, number>][] = [
    ['ops', Op],
    ['statuses', Status],
    ['invalid_fields', Field],
    ['busy_limits', Limit],
  ];
  for (const [name, ours] of tables) {
    test(`${name} match by name and value, both ways`, () => {
      const theirs = Object.fromEntries((constants[name] as { name: string; value: number }[]).map((e) => [e.name, e.value]));
      assert.deepEqual({ ...ours }, theirs);
    });
  }
  test('sizes match by name and value, both ways', () => {
    assert.deepEqual({ ...Sizes }, constants.sizes);
  });
  test('version', () => {
    assert.equal(VERSION, constants.version);
    assert.equal(VERSION, vectors.version);
  });
});

describe('request vectors', () => {
  assert.ok(vectors.requests.length > 0);
  for (const v of vectors.requests) {
    const f = v.fields;
    const fields = {
      op: opCode(f.op),
      flags: f.flags,
      id: BigInt(f.id),
      token: BigInt(f.token),
      leaseMs: f.lease_ms,
      waitMs: f.wait_ms,
      key: hex(f.key_hex),
    };
    test(`encode ${v.name}`, () => {
      assert.equal(encodeRequest(fields).toString('hex'), v.hex);
    });
    test(`decode ${v.name}`, () => {
      const { size, ...got } = decodeRequest(hex(v.hex));
      assert.equal(size, v.hex.length / 2);
      assert.deepEqual({ ...got, key: Buffer.from(got.key!) }, fields);
    });
  }
});

describe('response vectors', () => {
  assert.ok(vectors.responses.length > 0);
  for (const v of vectors.responses) {
    const f = v.fields;
    const fields = {
      op: opCode(f.op),
      status: statusCode(f.status),
      id: BigInt(f.id),
      token: BigInt(f.token),
      leaseMs: f.lease_ms,
      detail: f.detail,
      data: hex(f.data_hex),
    };
    test(`encode ${v.name}`, () => {
      assert.equal(encodeResponse(fields).toString('hex'), v.hex);
    });
    test(`decode ${v.name}`, () => {
      const { size, ...got } = decodeResponse(hex(v.hex));
      assert.equal(size, v.hex.length / 2);
      assert.deepEqual({ ...got, data: Buffer.from(got.data) }, fields);
      assert.equal(opName(got.op), f.op);
      assert.equal(statusName(got.status), f.status);
    });
    test(`the client maps ${v.name}`, () => {
      const r = decodeResponse(hex(v.hex));
      if (r.status === Status.OK) return;
      const e = errorForStatus(r.status, r.detail, r.data, 'op');
      assert.ok(e instanceof TicketingError);
      assert.equal(e.status, r.status);
      assert.equal(e.code, f.status);
    });
  }
});

describe('INSPECT data', () => {
  const byName = (n: string): any => vectors.responses.find((v: any) => v.name === n);
  test('inspect_held: held for 5000 ms, no lock-delay', () => {
    const r = decodeResponse(hex(byName('inspect_held').hex));
    assert.equal(r.data.length, Sizes.INSPECT_DATA);
    assert.deepEqual(decodeInspectData(r.data), { heldForMs: 5000, lockDelayMs: 0 });
  });
  test('inspect_free: zeros', () => {
    assert.deepEqual(decodeInspectData(decodeResponse(hex(byName('inspect_free').hex)).data), { heldForMs: 0, lockDelayMs: 0 });
  });
  test('lock-delay is the second u32; short data is refused', () => {
    assert.deepEqual(decodeInspectData(hex('ffffffff000005dc')), { heldForMs: 0xffffffff, lockDelayMs: 1500 });
    assert.throws(() => decodeInspectData(hex('00000000000000')), (e: FrameError) => e.reason === 'length');
  });
});

describe('handshake vectors', () => {
  assert.ok(vectors.handshake.length > 0);
  for (const v of vectors.handshake) {
    const bytes = hex(v.hex);
    test(`${v.name} (${v.op})`, () => {
      switch (v.op) {
        case 'HELLO': {
          const h = { version: v.version, flags: 0, sessionId: hex(v.session_id_hex), nonce: hex(v.nonce_hex) };
          assert.equal(encodeHello(h).toString('hex'), v.hex);
          const d = decodeHello(bytes);
          assert.deepEqual({ ...d, sessionId: Buffer.from(d.sessionId), nonce: Buffer.from(d.nonce) }, h);
          break;
        }
        case 'CHALLENGE': {
          const c = { status: statusCode(v.status), version: v.version, flags: v.flags ?? 0, nonce: hex(v.nonce_hex) };
          assert.equal(encodeChallenge(c).toString('hex'), v.hex);
          const d = decodeChallenge(bytes);
          assert.deepEqual({ ...d, nonce: Buffer.from(d.nonce) }, c);
          break;
        }
        case 'AUTH': {
          assert.equal(encodeAuth({ proof: hex(v.proof_hex) }).toString('hex'), v.hex);
          assert.equal(Buffer.from(decodeAuth(bytes).proof).toString('hex'), v.proof_hex);
          break;
        }
        case 'WELCOME': {
          const w = { status: statusCode(v.status), proof: hex(v.proof_hex) };
          assert.equal(encodeWelcome(w).toString('hex'), v.hex);
          const d = decodeWelcome(bytes);
          assert.deepEqual({ ...d, proof: Buffer.from(d.proof) }, w);
          break;
        }
        default:
          assert.fail(`unknown handshake op ${v.op}`);
      }
    });
  }
  test('fixed frames reject a wrong op or size', () => {
    const hello = hex(vectors.handshake.find((v: any) => v.op === 'HELLO').hex);
    assert.throws(() => decodeChallenge(hello), (e: FrameError) => e.reason === 'length');
    const ch = hex(vectors.handshake.find((v: any) => v.op === 'CHALLENGE').hex);
    assert.throws(() => decodeWelcome(ch), (e: FrameError) => e.reason === 'wrong_op');
    assert.throws(() => decodeWelcome(ch.subarray(0, 3)), (e: FrameError) => e.reason === 'short');
  });
});

describe('auth vectors', () => {
  assert.ok(vectors.auth.length > 0);
  for (const v of vectors.auth) {
    const args = [hex(v.session_id_hex), hex(v.client_nonce_hex), hex(v.server_nonce_hex)] as const;
    test(`${v.name}: client proof`, () => {
      assert.equal(clientProof(v.token_utf8, ...args).toString('hex'), v.client_proof_hex);
      assert.equal(clientProof(Buffer.from(v.token_utf8, 'utf8'), ...args).toString('hex'), v.client_proof_hex);
    });
    test(`${v.name}: server proof`, () => {
      const p = serverProof(v.token_utf8, ...args);
      assert.equal(p.toString('hex'), v.server_proof_hex);
      assert.ok(proofEqual(p, hex(v.server_proof_hex)));
      assert.ok(!proofEqual(p, clientProof(v.token_utf8, ...args)));
      assert.ok(!proofEqual(p, p.subarray(1)));
    });
    test(`${v.name}: a wrong token gives other proofs`, () => {
      assert.notEqual(clientProof(v.token_utf8 + 'x', ...args).toString('hex'), v.client_proof_hex);
    });
  }
});

describe('malformed vectors', () => {
  for (const v of vectors.malformed) {
    test(`${v.name} -> ${v.error}`, () => {
      const decode = v.kind === 'request' ? decodeRequest : decodeResponse;
      assert.throws(
        () => decode(hex(v.hex), v.max_var),
        (e: unknown) => e instanceof FrameError && e.reason === v.error,
      );
    });
  }
});

describe('FrameReader', () => {
  const frames: Buffer[] = vectors.responses.map((v: any) => hex(v.hex));
  const stream = Buffer.concat(frames);

  const collect = (chunks: Buffer[]): string[] => {
    const out: string[] = [];
    const r = new FrameReader((f) => out.push(f.toString('hex')));
    for (const c of chunks) r.push(c);
    assert.equal(r.buffered, 0);
    return out;
  };
  const want = frames.map((f) => f.toString('hex'));

  test('many frames in one chunk', () => {
    assert.deepEqual(collect([stream]), want);
  });
  test('one byte at a time', () => {
    const chunks: Buffer[] = [];
    for (let i = 0; i < stream.length; i++) chunks.push(stream.subarray(i, i + 1));
    assert.deepEqual(collect(chunks), want);
  });
  test('every split point of two chunks', () => {
    for (let i = 1; i < stream.length; i++) assert.deepEqual(collect([stream.subarray(0, i), stream.subarray(i)]), want);
  });
  test('random chunking', () => {
    for (let round = 0; round < 200; round++) {
      const chunks: Buffer[] = [];
      for (let i = 0; i < stream.length; ) {
        const n = 1 + Math.floor(Math.random() * 60);
        chunks.push(stream.subarray(i, i + n));
        i += n;
      }
      assert.deepEqual(collect(chunks), want);
    }
  });
  test('a frame with the largest data', () => {
    const big = encodeResponse({ op: Op.ACQUIRE, status: Status.INVALID, id: 1n, token: 0n, leaseMs: 0, detail: 4, data: Buffer.alloc(Sizes.MAX_KEY_LEN, 0x61) });
    const s = Buffer.concat([big, frames[0]!, big]);
    const chunks: Buffer[] = [];
    for (let i = 0; i < s.length; i += 1000) chunks.push(s.subarray(i, i + 1000));
    assert.deepEqual(collect(chunks), [big, frames[0]!, big].map((f) => f.toString('hex')));
  });
  test('rejects a length below the header and above the ceiling', () => {
    const r = new FrameReader(() => {});
    assert.throws(() => r.push(hex('0000001b14000000')), (e: FrameError) => e.reason === 'length');
    const r2 = new FrameReader(() => {});
    r2.push(hex('0001'));
    assert.throws(() => r2.push(hex('001c10')), (e: FrameError) => e.reason === 'too_large');
  });
});

describe('status mapping', () => {
  const cases: [number, new (...a: any[]) => TicketingError][] = [
    [Status.TIMED_OUT, NotAcquiredError],
    [Status.NOT_HELD, NotHeldError],
    [Status.INVALID, InvalidRequestError],
    [Status.NOT_LEADER, NotLeaderError],
    [Status.BUSY, BusyError],
    [Status.SHUTTING_DOWN, ShuttingDownError],
    [Status.AUTH_FAILED, AuthFailedError],
    [Status.UNSUPPORTED_VERSION, UnsupportedVersionError],
    [Status.CANCELLED, CancelledError],
  ];
  test('every non-OK status has a class', () => {
    const mapped = new Set(cases.map(([s]) => s));
    for (const [name, code] of Object.entries(Status)) if (code !== Status.OK) assert.ok(mapped.has(code), name);
  });
  for (const [status, cls] of cases) {
    test(`${statusName(status)} -> ${cls.name}`, () => {
      const e = errorForStatus(status, 2, Buffer.from('why'), 'acquire "k"');
      assert.ok(e instanceof cls);
      assert.ok(e instanceof TicketingError);
      assert.ok(e instanceof Error);
      assert.equal(e.status, status);
      assert.equal(e.detail, 2);
      assert.match(e.message, /acquire "k"/);
    });
  }
  test('INVALID carries the field, BUSY the limit, NOT_LEADER the leader', () => {
    const inv = errorForStatus(Status.INVALID, Field.KEY, Buffer.from('key longer than 256 bytes'), 'x') as InvalidRequestError;
    assert.equal(inv.field, Field.KEY);
    assert.equal(inv.fieldName, 'KEY');
    assert.match(inv.message, /key longer than 256 bytes/);
    const busy = errorForStatus(Status.BUSY, Limit.INFLIGHT, Buffer.alloc(0), 'x') as BusyError;
    assert.equal(busy.limit, Limit.INFLIGHT);
    assert.equal(busy.limitName, 'INFLIGHT');
    const nl = errorForStatus(Status.NOT_LEADER, 0, Buffer.from('127.0.0.2:7070'), 'x') as NotLeaderError;
    assert.equal(nl.leader, '127.0.0.2:7070');
    assert.equal(new CancelledError().name, 'AbortError');
  });
  test('an unknown status is a TicketingError carrying its number', () => {
    const e = errorForStatus(200, 0, Buffer.alloc(0), 'x');
    assert.equal(e.constructor, TicketingError);
    assert.equal(e.status, 200);
    assert.equal(e.code, 'STATUS_200');
  });
});

describe('package', () => {
  test('the CommonJS build exports the same API', async () => {
    const { createRequire } = await import('node:module');
    const cjs = createRequire(import.meta.url)('@ticketing/client');
    const esm = await import('@ticketing/client');
    assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
    assert.equal(typeof cjs.createClient, 'function');
    assert.deepEqual(cjs.Status, Status);
  });
  test('Symbol.asyncDispose is defined', () => {
    assert.equal(typeof Symbol.asyncDispose, 'symbol');
  });
});
