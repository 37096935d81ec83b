using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Ticketing.Conformance
{
    /// <summary>
    /// The C# client's conformance driver (tests/conformance/DRIVER.md): JSON commands on stdin, one
    /// per line, each run concurrently on the client's public API; replies and <c>lost</c> events on
    /// stdout, one line each.
    /// </summary>
    internal sealed class Driver
    {
        private static readonly string[] Features =
        {
            "locks", "cancel", "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls", "request_timeout", "lost_events", "connect_election",
        };

        private readonly TextWriter _out;
        private readonly object _outLock = new object();
        private readonly ConcurrentDictionary<string, TicketingClient> _clients = new ConcurrentDictionary<string, TicketingClient>();
        private readonly ConcurrentDictionary<string, TicketingLock> _locks = new ConcurrentDictionary<string, TicketingLock>();
        private readonly ConcurrentDictionary<long, CancellationTokenSource> _pending = new ConcurrentDictionary<long, CancellationTokenSource>();
        private int _running;

        private Driver(TextWriter output)
        {
            _out = output;
        }

        private static int Main()
        {
            // The commands await; nothing blocks a pool thread for long, but a loaded machine should
            // not wait for Mono to add threads one by one.
            ThreadPool.SetMinThreads(32, 32);
            var stdout = new StreamWriter(Console.OpenStandardOutput(), new UTF8Encoding(false)) { AutoFlush = false };
            var stdin = new StreamReader(Console.OpenStandardInput(), new UTF8Encoding(false));
            new Driver(stdout).Run(stdin);
            return 0;
        }

        private void Run(TextReader input)
        {
            string line;
            while ((line = input.ReadLine()) != null)
            {
                if (line.Trim().Length == 0)
                {
                    continue;
                }
                Dictionary<string, object> cmd;
                try
                {
                    cmd = (Dictionary<string, object>)Json.Parse(line);
                }
                catch (Exception e)
                {
                    Console.Error.WriteLine("driver: unreadable command: " + line + ": " + e.Message);
                    continue;
                }
                object id;
                cmd.TryGetValue("id", out id);
                if (Str(cmd, "op") == "exit")
                {
                    WaitForRunning(20); // let answers already on their way out go first (bounded)
                    Reply(id, new Dictionary<string, object>());
                    return;
                }
                Interlocked.Increment(ref _running);
                Task.Run(() => HandleAsync(id, cmd)).ContinueWith(t => Interlocked.Decrement(ref _running));
            }
            // stdin closed: let the commands in flight answer (bounded), then exit
            WaitForRunning(100);
        }

        private void WaitForRunning(int rounds)
        {
            for (int i = 0; i < rounds && Volatile.Read(ref _running) > 0; i++)
            {
                Thread.Sleep(50);
            }
        }

        private async Task HandleAsync(object id, Dictionary<string, object> cmd)
        {
            try
            {
                Dictionary<string, object> result = await DispatchAsync(Convert.ToInt64(id, CultureInfo.InvariantCulture), cmd).ConfigureAwait(false);
                Reply(id, result);
            }
            catch (Exception e)
            {
                Fail(id, e);
            }
        }

        private void Emit(Dictionary<string, object> msg)
        {
            string line = Json.Write(msg);
            lock (_outLock)
            {
                _out.Write(line);
                _out.Write('\n');
                _out.Flush();
            }
        }

        private void Reply(object id, Dictionary<string, object> result)
        {
            var m = new Dictionary<string, object> { { "id", id }, { "ok", true } };
            foreach (KeyValuePair<string, object> kv in result)
            {
                m[kv.Key] = kv.Value;
            }
            Emit(m);
        }

        private void Fail(object id, Exception e)
        {
            while (e is AggregateException && e.InnerException != null)
            {
                e = e.InnerException;
            }
            var err = new Dictionary<string, object> { { "kind", Kind(e) }, { "message", e.Message } };
            var lost = e as LockLostException;
            if (lost != null)
            {
                err["reason"] = Reason(lost.Reason);
            }
            if ((string)err["kind"] == "other")
            {
                Console.Error.WriteLine("driver: unexpected error: " + e);
            }
            Emit(new Dictionary<string, object> { { "id", id }, { "ok", false }, { "error", err } });
        }

        internal static string Kind(Exception e)
        {
            if (e is NotAcquiredException)
            {
                return "not_acquired";
            }
            if (e is OperationCanceledException)
            {
                return "cancelled";
            }
            if (e is NotHeldException)
            {
                return "not_held";
            }
            if (e is LockLostException)
            {
                return "lock_lost";
            }
            if (e is ArgumentException || e is InvalidRequestException || e is FormatException || e is OverflowException)
            {
                return "invalid_argument";
            }
            if (e is AlreadyHeldException)
            {
                return "already_held";
            }
            if (e is AuthFailedException)
            {
                return "auth_failed";
            }
            if (e is UnsupportedVersionException)
            {
                return "unsupported_version";
            }
            if (e is UnavailableException)
            {
                return "unavailable";
            }
            if (e is TlsException)
            {
                return "tls";
            }
            if (e is RequestTimeoutException)
            {
                return "timeout";
            }
            if (e is ConnectionLostException)
            {
                return "connection_lost";
            }
            if (e is ServerRestartedException)
            {
                return "server_restarted";
            }
            if (e is BusyException)
            {
                return "busy";
            }
            if (e is ShuttingDownException)
            {
                return "shutting_down";
            }
            if (e is ClosedException)
            {
                return "closed";
            }
            return "other";
        }

        internal static string Reason(LostReason r)
        {
            switch (r)
            {
                case LostReason.Expired:
                    return "expired";
                case LostReason.NotHeld:
                    return "not_held";
                case LostReason.ServerRestarted:
                    return "server_restarted";
                default:
                    return "server_stopping";
            }
        }

        private static readonly Dictionary<string, object> Empty = new Dictionary<string, object>();

        private async Task<Dictionary<string, object>> DispatchAsync(long id, Dictionary<string, object> c)
        {
            string op = Str(c, "op");
            switch (op)
            {
                case "hello":
                    return new Dictionary<string, object>
                    {
                        { "language", "csharp" },
                        { "client_version", typeof(TicketingClient).Assembly.GetName().Version.ToString(3) },
                        { "features", Features.ToList() },
                    };
                case "connect":
                    return await ConnectAsync(c).ConfigureAwait(false);
                case "close":
                    {
                        TicketingClient cl;
                        if (_clients.TryRemove(Str(c, "client"), out cl))
                        {
                            await cl.CloseAsync().ConfigureAwait(false);
                        }
                        return Empty;
                    }
                case "acquire":
                    return await AcquireAsync(id, c).ConfigureAwait(false);
                case "try_acquire":
                    {
                        var o = new AcquireOptions(Ms(c, "lease_ms")) { WaitTimeout = TimeSpan.Zero };
                        byte[] kb = KeyBytes(c);
                        TicketingLock l = await (kb != null ? Client(c).TryAcquireAsync(kb, o) : Client(c).TryAcquireAsync(Str(c, "key"), o)).ConfigureAwait(false);
                        if (l == null)
                        {
                            return new Dictionary<string, object> { { "acquired", false } };
                        }
                        Track(Str(c, "lock"), l);
                        return new Dictionary<string, object> { { "acquired", true }, { "token", l.Token.ToString(CultureInfo.InvariantCulture) } };
                    }
                case "cancel":
                    {
                        CancellationTokenSource cts;
                        if (_pending.TryGetValue(Convert.ToInt64(c["target"], CultureInfo.InvariantCulture), out cts))
                        {
                            try
                            {
                                cts.Cancel();
                            }
                            catch (ObjectDisposedException)
                            {
                                // the target has just replied
                            }
                        }
                        return Empty;
                    }
                case "release":
                    await Lock(c).ReleaseAsync().ConfigureAwait(false);
                    return Empty;
                case "extend":
                    {
                        TimeSpan lease = await Lock(c).ExtendAsync(Ms(c, "lease_ms")).ConfigureAwait(false);
                        return new Dictionary<string, object> { { "lease_ms", (long)lease.TotalMilliseconds } };
                    }
                case "lock_state":
                    {
                        TicketingLock l = Lock(c);
                        LostReason? reason = l.LostReason;
                        var m = new Dictionary<string, object> { { "lost", reason != null } };
                        if (reason != null)
                        {
                            m["reason"] = Reason(reason.Value);
                        }
                        m["token"] = l.Token.ToString(CultureInfo.InvariantCulture);
                        m["deadline_in_ms"] = l.TimeLeft.TotalMilliseconds;
                        return m;
                    }
                case "verify":
                    return new Dictionary<string, object> { { "held", await Lock(c).VerifyAsync().ConfigureAwait(false) } };
                case "release_token":
                    await Client(c).ReleaseAsync(Str(c, "key"), ulong.Parse(Str(c, "token") ?? "", NumberStyles.None, CultureInfo.InvariantCulture)).ConfigureAwait(false);
                    return Empty;
                case "inspect":
                    {
                        LockInfo i = await Client(c).InspectAsync(Str(c, "key")).ConfigureAwait(false);
                        return new Dictionary<string, object>
                        {
                            { "held", i.Held },
                            { "waiters", i.Waiters },
                            { "lease_left_ms", (long)i.LeaseLeft.TotalMilliseconds },
                        };
                    }
                case "ping":
                    await Client(c).PingAsync().ConfigureAwait(false);
                    return Empty;
                case "with_lock":
                    {
                        TimeSpan hold = Ms(c, "hold_ms");
                        await Client(c).WithLockAsync(Str(c, "key"), new AcquireOptions(Ms(c, "lease_ms")),
                            l => Task.Delay(hold, l.HandleLostToken)).ConfigureAwait(false);
                        return Empty;
                    }
                case "reset":
                    {
                        var all = _clients.Values.ToList();
                        _clients.Clear();
                        _locks.Clear();
                        _pending.Clear();
                        await Task.WhenAll(all.Select(cl => cl.CloseAsync())).ConfigureAwait(false);
                        return Empty;
                    }
                default:
                    throw new InvalidOperationException("unknown op " + op);
            }
        }

        private async Task<Dictionary<string, object>> ConnectAsync(Dictionary<string, object> c)
        {
            var o = new TicketingOptions
            {
                Endpoints = ((List<object>)c["endpoints"]).Select(e => (string)e).ToList(),
                Token = Str(c, "token"),
            };
            if (c.ContainsKey("request_timeout_ms") && c["request_timeout_ms"] != null)
            {
                o.RequestTimeout = Ms(c, "request_timeout_ms");
            }
            if (c.ContainsKey("heartbeat_ms") && c["heartbeat_ms"] != null)
            {
                o.HeartbeatInterval = Ms(c, "heartbeat_ms");
            }
            if (c.ContainsKey("dial_timeout_ms") && c["dial_timeout_ms"] != null)
            {
                o.ConnectTimeout = Ms(c, "dial_timeout_ms");
            }
            object tlsValue;
            if (c.TryGetValue("tls", out tlsValue) && tlsValue != null)
            {
                var tls = (Dictionary<string, object>)tlsValue;
                var t = new TlsOptions { ServerName = Str(tls, "server_name") };
                if (Str(tls, "ca") != null)
                {
                    t.TrustedCertificates = TlsOptions.LoadCertificates(Str(tls, "ca"));
                }
                if (Str(tls, "cert") != null && Str(tls, "key") != null)
                {
                    t.ClientCertificate = TlsOptions.LoadClientCertificate(Str(tls, "cert"), Str(tls, "key"));
                }
                o.Tls = t;
            }
            TicketingClient cl = await TicketingClient.ConnectAsync(o).ConfigureAwait(false);
            string name = Str(c, "client");
            TicketingClient old = null;
            _clients.AddOrUpdate(name, cl, (k, prev) =>
            {
                old = prev;
                return cl;
            });
            if (old != null)
            {
                await old.CloseAsync().ConfigureAwait(false);
            }
            return new Dictionary<string, object> { { "session_id", cl.SessionId } };
        }

        private async Task<Dictionary<string, object>> AcquireAsync(long id, Dictionary<string, object> c)
        {
            object wait;
            c.TryGetValue("wait_ms", out wait);
            var o = new AcquireOptions(Ms(c, "lease_ms"))
            {
                WaitTimeout = wait == null ? (TimeSpan?)null : TimeSpan.FromMilliseconds(Convert.ToDouble(wait, CultureInfo.InvariantCulture)),
                KeepAlive = Bool(c, "keepalive"),
                RefuseHeld = Bool(c, "refuse_held"),
            };
            TicketingClient client = Client(c);
            using (var cts = new CancellationTokenSource())
            {
                _pending[id] = cts;
                try
                {
                    byte[] kb = KeyBytes(c);
                    TicketingLock l = await (kb != null ? client.AcquireAsync(kb, o, cts.Token) : client.AcquireAsync(Str(c, "key"), o, cts.Token)).ConfigureAwait(false);
                    Track(Str(c, "lock"), l);
                    return new Dictionary<string, object>
                    {
                        { "token", l.Token.ToString(CultureInfo.InvariantCulture) },
                        { "lease_ms", (long)l.Lease.TotalMilliseconds },
                    };
                }
                finally
                {
                    CancellationTokenSource ignored;
                    _pending.TryRemove(id, out ignored);
                }
            }
        }

        private void Track(string name, TicketingLock l)
        {
            _locks[name] = l;
            l.HandleLostToken.Register(() =>
            {
                TicketingLock current;
                if (!_locks.TryGetValue(name, out current) || current != l)
                {
                    return; // forgotten by reset
                }
                Emit(new Dictionary<string, object>
                {
                    { "event", "lost" },
                    { "lock", name },
                    { "reason", Reason(l.LostReason ?? LostReason.Expired) },
                });
            });
        }

        private TicketingClient Client(Dictionary<string, object> c)
        {
            TicketingClient cl;
            if (!_clients.TryGetValue(Str(c, "client") ?? "", out cl))
            {
                throw new ClosedException("no client named " + Str(c, "client"));
            }
            return cl;
        }

        private TicketingLock Lock(Dictionary<string, object> c)
        {
            TicketingLock l;
            if (!_locks.TryGetValue(Str(c, "lock") ?? "", out l))
            {
                throw new InvalidOperationException("no lock named " + Str(c, "lock"));
            }
            return l;
        }

        private static string Str(Dictionary<string, object> c, string k)
        {
            object v;
            return c.TryGetValue(k, out v) && v != null ? Convert.ToString(v, CultureInfo.InvariantCulture) : null;
        }

        private static bool Bool(Dictionary<string, object> c, string k)
        {
            object v;
            return c.TryGetValue(k, out v) && v is bool && (bool)v;
        }

        /// <summary>Milliseconds as the client's duration type, passed on unchecked (the client validates).</summary>
        private static TimeSpan Ms(Dictionary<string, object> c, string k)
        {
            object v;
            if (!c.TryGetValue(k, out v) || !(v is long || v is double))
            {
                throw new ArgumentException(k + " must be a number of milliseconds, got " + (v ?? "null"));
            }
            return TimeSpan.FromTicks((long)(Convert.ToDouble(v, CultureInfo.InvariantCulture) * TimeSpan.TicksPerMillisecond));
        }

        /// <summary>The bytes of <c>key_hex</c> (for the client's byte[] overloads), or null when the command gives <c>key</c>.</summary>
        private static byte[] KeyBytes(Dictionary<string, object> c)
        {
            string hex = Str(c, "key_hex");
            if (hex == null)
            {
                return null;
            }
            if (hex.Length % 2 != 0)
            {
                throw new FormatException("key_hex has an odd number of digits");
            }
            byte[] b = new byte[hex.Length / 2];
            for (int i = 0; i < b.Length; i++)
            {
                b[i] = byte.Parse(hex.Substring(2 * i, 2), NumberStyles.HexNumber, CultureInfo.InvariantCulture);
            }
            return b;
        }
    }
}
