// Unit tests of the protocol module against the repository's shared vectors and code tables
// (protocol/vectors.json, protocol/constants.json), read in place at test time, never copied.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  ClientRules,
  ExpiredReason,
  Field,
  FrameError,
  FrameReader,
  GoawayReason,
  InspectFlag,
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
  encodeInspectData,
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
  InvalidArgumentError,
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

const table = (name: string): Record<string, number> => Object.fromEntries((constants[name] as { name: string; value: number }[]).map((e) => [e.name, e.value]));
const opCode = (name: string): number => (name.startsWith('0x') ? parseInt(name, 16) : table('ops')[name]!);
const statusCode = (name: string): number => table('statuses')[name]!;

describe('constants.json', () => {
  const tables: [string, Record<string, number>][] = [
    ['ops', Op],
    ['statuses', Status],
    ['invalid_fields', Field],
    ['busy_limits', Limit],
    ['expired_reasons', ExpiredReason],
    ['goaway_reasons', GoawayReason],
    ['inspect_flags', InspectFlag],
  ];
  for (const [name, ours] of tables) {
    test(`${name} match by name and value, both ways`, () => {
      assert.deepEqual({ ...ours }, table(name));
    });
  }
  test('every table of constants.json is checked', () => {
    const tableKeys = Object.keys(constants).filter((k) => Array.isArray(constants[k]));
    assert.deepEqual(tableKeys.sort(), tables.map(([n]) => n).sort());
  });
  test('sizes match by name and value, both ways', () => {
    assert.deepEqual({ ...Sizes }, constants.sizes);
  });
  test('client rules match', () => {
    assert.deepEqual({ ...ClientRules }, constants.client_rules);
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
      assert.deepEqual({ ...got, key: Buffer.from(got.key) }, fields);
      assert.equal(opName(got.op), f.op);
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
      assert.equal(e.detail, r.detail);
      assert.ok(!e.message.includes('\n'), 'one line');
    });
  }
});

describe('INSPECT data', () => {
  const inspect = vectors.responses.filter((v: any) => v.fields.op === 'INSPECT' && v.fields.status === 'OK');
  test('there are INSPECT vectors', () => assert.ok(inspect.length >= 3));
  for (const v of inspect) {
    test(`${v.name}: 12 bytes, round trip`, () => {
      const r = decodeResponse(hex(v.hex));
      assert.equal(r.data.length, Sizes.INSPECT_DATA);
      const d = decodeInspectData(r.data);
      assert.equal(encodeInspectData(d).toString('hex'), v.fields.data_hex);
    });
  }
  const byName = (n: string): any => {
    const v = vectors.responses.find((x: any) => x.name === n);
    assert.ok(v, `vector ${n}`);
    return decodeInspectData(decodeResponse(hex(v.hex)).data);
  };
  test('inspect_held_by_other: held for 5000 ms, flags HELD', () => {
    assert.deepEqual(byName('inspect_held_by_other'), { heldForMs: 5000, lockDelayMs: 0, flags: InspectFlag.HELD });
  });
  test('inspect_held_token_match: HELD|TOKEN_MATCH|SESSION', () => {
    assert.deepEqual(byName('inspect_held_token_match'), { heldForMs: 5000, lockDelayMs: 0, flags: InspectFlag.HELD | InspectFlag.TOKEN_MATCH | InspectFlag.SESSION });
  });
  test('inspect_lock_delay: 750 ms of lock-delay, not held', () => {
    assert.deepEqual(byName('inspect_lock_delay'), { heldForMs: 0, lockDelayMs: 750, flags: 0 });
  });
  test('inspect_free: zeros', () => {
    assert.deepEqual(byName('inspect_free'), { heldForMs: 0, lockDelayMs: 0, flags: 0 });
  });
  test('short data is refused; longer data is allowed', () => {
    assert.throws(() => decodeInspectData(hex('0000000000000000000000')), (e: FrameError) => e.reason === 'length');
    assert.deepEqual(decodeInspectData(hex('00000001000000020000000fff')), { heldForMs: 1, lockDelayMs: 2, flags: 15 });
  });
});

describe('handshake vectors', () => {
  assert.ok(vectors.handshake.length > 0);
  const ops = new Set(vectors.handshake.map((v: any) => v.op));
  test('all four handshake frames have vectors', () => assert.deepEqual([...ops].sort(), ['AUTH', 'CHALLENGE', 'HELLO', 'WELCOME']));
  for (const v of vectors.handshake) {
    const bytes = hex(v.hex);
    test(`${v.name} (${v.op}): encode and decode`, () => {
      switch (v.op) {
        case 'HELLO': {
          const h = { version: v.version, flags: v.flags, sessionId: hex(v.session_id_hex), nonce: hex(v.nonce_hex) };
          assert.equal(encodeHello(h).toString('hex'), v.hex);
          const d = decodeHello(bytes);
          assert.deepEqual({ ...d, sessionId: Buffer.from(d.sessionId), nonce: Buffer.from(d.nonce) }, h);
          break;
        }
        case 'CHALLENGE': {
          const c = { status: statusCode(v.status), version: v.version, flags: v.flags, detail: v.detail, nonce: hex(v.nonce_hex), data: hex(v.data_hex) };
          assert.equal(encodeChallenge(c).toString('hex'), v.hex);
          const d = decodeChallenge(bytes);
          assert.deepEqual({ ...d, nonce: Buffer.from(d.nonce), data: Buffer.from(d.data) }, c);
          break;
        }
        case 'AUTH': {
          assert.equal(encodeAuth({ proof: hex(v.proof_hex) }).toString('hex'), v.hex);
          assert.equal(Buffer.from(decodeAuth(bytes).proof).toString('hex'), v.proof_hex);
          break;
        }
        case 'WELCOME': {
          const w = {
            status: statusCode(v.status),
            flags: v.flags,
            detail: v.detail,
            sessionGraceMs: v.session_grace_ms,
            stateId: v.state_id_hex ? hex(v.state_id_hex) : Buffer.alloc(16),
            proof: hex(v.proof_hex),
          };
          assert.equal(encodeWelcome(w).toString('hex'), v.hex);
          const d = decodeWelcome(bytes);
          assert.deepEqual({ ...d, stateId: Buffer.from(d.stateId), proof: Buffer.from(d.proof) }, w);
          break;
        }
        default:
          assert.fail(`unknown handshake op ${v.op}`);
      }
    });
  }
  test('handshake frames reject a wrong op, size or data length', () => {
    const frame = (name: string): Buffer => hex(vectors.handshake.find((v: any) => v.name === name).hex);
    const hello = frame('hello');
    assert.throws(() => decodeChallenge(hello), (e: FrameError) => e.reason === 'wrong_op' || e.reason === 'length');
    assert.throws(() => decodeWelcome(frame('challenge_auth')), (e: FrameError) => e.reason === 'length');
    assert.throws(() => decodeWelcome(hex(frame('welcome_new_session').toString('hex').replace(/^0000003c04/, '0000003c02'))), (e: FrameError) => e.reason === 'wrong_op');
    assert.throws(() => decodeWelcome(hello.subarray(0, 3)), (e: FrameError) => e.reason === 'short');
    const nl = Buffer.from(frame('challenge_not_leader'));
    assert.throws(() => decodeChallenge(nl.subarray(0, nl.length - 1)), (e: FrameError) => e.reason === 'short' || e.reason === 'length');
    nl.writeUInt16BE(3, 12); // data_len disagrees with the length
    assert.throws(() => decodeChallenge(nl), (e: FrameError) => e.reason === 'length');
    const big = Buffer.alloc(Sizes.CHALLENGE + Sizes.MAX_CHALLENGE_DATA + 1);
    big.writeUInt32BE(big.length - 4, 0);
    big[4] = Op.CHALLENGE;
    assert.throws(() => decodeChallenge(big), (e: FrameError) => e.reason === 'length');
  });
});

describe('auth vectors', () => {
  assert.ok(vectors.auth.length >= 2);
  const welcomes = vectors.handshake.filter((v: any) => v.op === 'WELCOME' && v.status === 'OK' && /[^0]/.test(v.proof_hex));
  for (const v of vectors.auth) {
    const args = [hex(v.session_id_hex), hex(v.client_nonce_hex), hex(v.server_nonce_hex)] as const;
    const signed = { status: Status.OK, flags: v.welcome_flags, detail: 0, sessionGraceMs: v.session_grace_ms, stateId: hex(v.state_id_hex) };
    test(`${v.name}: client proof`, () => {
      assert.equal(clientProof(v.token_utf8, ...args).toString('hex'), v.client_proof_hex);
      assert.equal(clientProof(Buffer.from(v.token_utf8, 'utf8'), ...args).toString('hex'), v.client_proof_hex);
    });
    test(`${v.name}: server proof from the WELCOME fields`, () => {
      const p = serverProof(v.token_utf8, ...args, signed);
      assert.equal(p.toString('hex'), v.server_proof_hex);
      assert.ok(proofEqual(p, hex(v.server_proof_hex)));
      assert.ok(!proofEqual(p, clientProof(v.token_utf8, ...args)));
      assert.ok(!proofEqual(p, p.subarray(1)));
    });
    test(`${v.name}: server proof from the WELCOME frame as sent`, () => {
      const frame = welcomes.find((w: any) => w.proof_hex === v.server_proof_hex);
      assert.ok(frame, 'a WELCOME vector carries this proof');
      assert.equal(serverProof(v.token_utf8, ...args, hex(frame.hex)).toString('hex'), v.server_proof_hex);
    });
    test(`${v.name}: the proof covers the resumed flag, the grace and the state id`, () => {
      const base = serverProof(v.token_utf8, ...args, signed).toString('hex');
      const other = Buffer.from(signed.stateId);
      other[0]! ^= 1;
      for (const change of [{ flags: signed.flags ^ 1 }, { sessionGraceMs: signed.sessionGraceMs + 1 }, { stateId: other }, { detail: 1 }]) {
        assert.notEqual(serverProof(v.token_utf8, ...args, { ...signed, ...change }).toString('hex'), base, JSON.stringify(change));
      }
      assert.notEqual(clientProof(v.token_utf8 + 'x', ...args).toString('hex'), v.client_proof_hex);
    });
  }
});

describe('malformed vectors', () => {
  assert.ok(vectors.malformed.length > 0);
  for (const v of vectors.malformed) {
    test(`${v.name} -> ${v.error}`, () => {
      const decode = v.kind === 'request' ? decodeRequest : decodeResponse;
      assert.throws(
        () => decode(hex(v.hex), v.max_var),
        (e: unknown) => e instanceof FrameError && e.reason === v.error,
      );
    });
    test(`${v.name}: the stream reader ${v.error === 'short' ? 'waits for more' : 'rejects it'}`, () => {
      const framed: Buffer[] = [];
      const r = new FrameReader((f) => framed.push(Buffer.from(f)), v.max_var);
      if (v.error === 'short') {
        r.push(hex(v.hex));
        assert.equal(r.buffered, v.hex.length / 2);
        assert.equal(framed.length, 0);
      } else if (v.error === 'too_large') {
        assert.throws(() => r.push(hex(v.hex).subarray(0, 4)), (e: FrameError) => e.reason === 'too_large');
      } else {
        // A length below the header fails in the reader; a key/data length that disagrees with
        // the frame length is found by the decoder of the framed bytes.
        let thrown: unknown;
        try {
          r.push(hex(v.hex));
        } catch (e) {
          thrown = e;
        }
        if (thrown) assert.ok(thrown instanceof FrameError && thrown.reason === 'length');
        else {
          assert.equal(framed.length, 1);
          const decode = v.kind === 'request' ? decodeRequest : decodeResponse;
          assert.throws(() => decode(framed[0]!, v.max_var), (e: FrameError) => e.reason === 'length');
        }
      }
    });
  }
});

describe('FrameReader', () => {
  const frames: Buffer[] = [...vectors.responses, ...vectors.handshake.filter((v: any) => v.direction === 'server->client')].map((v: any) => hex(v.hex));
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
    for (let i = 1; i < stream.length; i += 3) assert.deepEqual(collect([stream.subarray(0, i), stream.subarray(i)]), want);
  });
  test('random chunking', () => {
    for (let round = 0; round < 100; round++) {
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
    const big = encodeResponse({ op: Op.ACQUIRE, status: Status.INVALID, id: 1n, token: 0n, leaseMs: 0, detail: 4, data: Buffer.alloc(Sizes.MAX_DATA_LEN, 0x61) });
    const s = Buffer.concat([big, frames[0]!, big]);
    const chunks: Buffer[] = [];
    for (let i = 0; i < s.length; i += 1000) chunks.push(s.subarray(i, i + 1000));
    assert.deepEqual(collect(chunks), [big, frames[0]!, big].map((f) => f.toString('hex')));
  });
});

describe('encoders refuse out-of-range fields', () => {
  test('id, token, lease and op widths', () => {
    assert.throws(() => encodeRequest({ op: Op.PING, id: -1n }), RangeError);
    assert.throws(() => encodeRequest({ op: Op.PING, id: 1n << 64n }), RangeError);
    assert.throws(() => encodeRequest({ op: Op.ACQUIRE, id: 1n, leaseMs: 2 ** 32 }), RangeError);
    assert.throws(() => encodeRequest({ op: 256, id: 1n }), RangeError);
    assert.throws(() => encodeHello({ version: 1, sessionId: Buffer.alloc(15), nonce: Buffer.alloc(32) }), RangeError);
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
  test('every non-OK status of constants.json has a class', () => {
    const mapped = new Set(cases.map(([s]) => s));
    for (const [name, code] of Object.entries(table('statuses'))) if (code !== Status.OK) assert.ok(mapped.has(code), name);
  });
  for (const [status, cls] of cases) {
    test(`${statusName(status)} -> ${cls.name}`, () => {
      const e = errorForStatus(status, 2, Buffer.from('why'), 'acquire "k"');
      assert.ok(e instanceof cls);
      assert.ok(e instanceof TicketingError);
      assert.equal(e.detail, 2);
      assert.match(e.message, /^acquire "k"/);
    });
  }
  test('INVALID is an InvalidArgumentError carrying the field; BUSY the limit; NOT_LEADER the leader', () => {
    const inv = errorForStatus(Status.INVALID, Field.KEY, Buffer.from('key longer than 256 bytes'), 'x') as InvalidRequestError;
    assert.ok(inv instanceof InvalidArgumentError);
    assert.equal(inv.field, Field.KEY);
    assert.equal(inv.fieldName, 'KEY');
    assert.match(inv.message, /key longer than 256 bytes/);
    const busy = errorForStatus(Status.BUSY, Limit.STORAGE, Buffer.alloc(0), 'x') as BusyError;
    assert.equal(busy.limitName, 'STORAGE');
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
