using System;
using System.Collections.Generic;
using System.Runtime.ExceptionServices;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// A Ticketing client: one session on one multiplexed connection, safe for concurrent use by any
    /// number of tasks. Create one per process and share it, as with StackExchange.Redis's
    /// multiplexer.
    /// </summary>
    /// <example>
    /// <code>
    /// using (var client = await TicketingClient.ConnectAsync("127.0.0.1:7070"))
    /// using (var lease = await client.AcquireAsync("order-1234", TimeSpan.FromSeconds(30)))
    /// {
    ///     await store.WriteAsync(order, lease.Token, lease.HandleLostToken); // the token fences the write
    /// } // released here
    /// </code>
    /// </example>
    /// <remarks>
    /// <para>Requests are pipelined: a queued acquire never holds back other calls. Cancelling an
    /// acquire's <see cref="CancellationToken"/> withdraws the wait from the server's queue, and a
    /// grant that raced the cancellation is released: a cancelled acquire never leaves a lock held.</para>
    /// <para>The connection is replaced by itself when it drops: calls wait for the reconnect
    /// (bounded by their timeouts) and unanswered requests are re-sent under their original ids, so a
    /// waiting acquire keeps its queue place and is never granted twice. Disposing the client does
    /// not release its locks unless <see cref="TicketingOptions.ReleaseOnClose"/> is set: the server
    /// keeps them until their leases end.</para>
    /// </remarks>
    public sealed class TicketingClient : IDisposable, IAsyncDisposable
    {
        private readonly Engine _engine;
        private readonly TicketingOptions _options;

        private TicketingClient(Engine engine, TicketingOptions options)
        {
            _engine = engine;
            _options = options;
        }

        /// <summary>
        /// Connects to the first endpoint that answers (following a cluster's leader hint), within
        /// the connect timeout per endpoint. A round in which no endpoint could be connected to fails
        /// at once, unless a node answered "not the leader" (a cluster electing a leader): then it
        /// tries again, at the shortest reconnect backoff, until the request timeout has passed since
        /// it began (then it throws the last round's <see cref="UnavailableException"/>) or
        /// <paramref name="cancellationToken"/> is cancelled.
        /// </summary>
        /// <param name="options">the settings (null: every default)</param>
        /// <param name="cancellationToken">abandons connecting</param>
        /// <returns>the connected client</returns>
        /// <exception cref="ArgumentException">an option is out of range</exception>
        /// <exception cref="UnavailableException">no endpoint can be reached</exception>
        /// <exception cref="AuthFailedException">the token is refused, missing, or not needed</exception>
        /// <exception cref="TlsException">the TLS handshake failed</exception>
        /// <exception cref="UnsupportedVersionException">the server speaks another protocol version</exception>
        /// <exception cref="OperationCanceledException">the token was cancelled</exception>
        public static Task<TicketingClient> ConnectAsync(TicketingOptions options, CancellationToken cancellationToken = default(CancellationToken))
        {
            TicketingOptions copy = (options ?? new TicketingOptions()).Clone();
            Settings settings = copy.Validate();
            return ConnectCoreAsync(copy, settings, cancellationToken);
        }

        private static async Task<TicketingClient> ConnectCoreAsync(TicketingOptions copy, Settings settings, CancellationToken cancellationToken)
        {
            var engine = new Engine(settings);
            try
            {
                await engine.StartAsync(cancellationToken).ConfigureAwait(false);
            }
            catch (Exception)
            {
                await engine.CloseAsync().ConfigureAwait(false);
                throw;
            }
            return new TicketingClient(engine, copy);
        }

        /// <summary>Connects to one endpoint with every other default; see <see cref="ConnectAsync(TicketingOptions, CancellationToken)"/>.</summary>
        /// <param name="endpoint"><c>host:port</c></param>
        /// <param name="cancellationToken">abandons connecting</param>
        /// <returns>the connected client</returns>
        public static Task<TicketingClient> ConnectAsync(string endpoint, CancellationToken cancellationToken = default(CancellationToken))
        {
            return ConnectAsync(new TicketingOptions { Endpoints = new List<string> { endpoint } }, cancellationToken);
        }

        /// <summary>Connects and blocks until connected; see <see cref="ConnectAsync(TicketingOptions, CancellationToken)"/>.</summary>
        /// <param name="options">the settings (null: every default)</param>
        /// <returns>the connected client</returns>
        public static TicketingClient Connect(TicketingOptions options)
        {
            return ConnectAsync(options).GetAwaiter().GetResult();
        }

        /// <summary>Connects to one endpoint and blocks until connected; see <see cref="ConnectAsync(TicketingOptions, CancellationToken)"/>.</summary>
        /// <param name="endpoint"><c>host:port</c></param>
        /// <returns>the connected client</returns>
        public static TicketingClient Connect(string endpoint)
        {
            return ConnectAsync(endpoint).GetAwaiter().GetResult();
        }

        /// <summary>A copy of the settings this client runs with.</summary>
        public TicketingOptions Options => _options.Clone();

        /// <summary>The session id (32 hex digits): new per client, the same on every reconnect, new after a server restart.</summary>
        public string SessionId => _engine.SessionIdHex;

        /// <summary>Tells whether the client was closed (or is closing).</summary>
        public bool IsClosed => _engine.IsClosed;

        // ---- acquire ----

        /// <summary>
        /// Acquires the lock on <paramref name="key"/>, waiting in the key's FIFO queue at most
        /// <paramref name="waitTimeout"/> (null: without limit).
        /// </summary>
        /// <param name="key">a non-empty key of at most 65,535 UTF-8 bytes</param>
        /// <param name="lease">how long the lock is held unless released or extended; starts at the grant; at least 1 ms</param>
        /// <param name="waitTimeout">null or <see cref="Timeout.InfiniteTimeSpan"/>: without limit; <see cref="TimeSpan.Zero"/>: try once</param>
        /// <param name="cancellationToken">withdraws the wait (a grant that raced it is released)</param>
        /// <returns>the held lock</returns>
        /// <exception cref="ArgumentException">a bad key, lease or wait timeout (nothing is sent)</exception>
        /// <exception cref="NotAcquiredException">the wait timeout passed; nothing is held</exception>
        /// <exception cref="OperationCanceledException">the token was cancelled; nothing is held</exception>
        /// <exception cref="TicketingException">a server or connection error</exception>
        public Task<TicketingLock> AcquireAsync(string key, TimeSpan lease, TimeSpan? waitTimeout = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            // Options made here need no defensive copy (Check's): nobody else holds them.
            return AcquireCoreAsync(Args.Key(key), Validate(new AcquireOptions(lease) { WaitTimeout = waitTimeout }), cancellationToken);
        }

        /// <summary>Acquires the lock on <paramref name="key"/> with these options; see <see cref="AcquireAsync(string, TimeSpan, TimeSpan?, CancellationToken)"/>.</summary>
        /// <param name="key">the key</param>
        /// <param name="options">lease, wait timeout, keep-alive...</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the held lock</returns>
        /// <exception cref="AlreadyHeldException">with <see cref="AcquireOptions.RefuseHeld"/>, when this client holds the key</exception>
        public Task<TicketingLock> AcquireAsync(string key, AcquireOptions options, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AcquireCoreAsync(Args.Key(key), Check(options), cancellationToken);
        }

        /// <summary>Acquires the lock on a binary key; see <see cref="AcquireAsync(string, AcquireOptions, CancellationToken)"/>.</summary>
        /// <param name="key">the key's bytes, 1 to 65,535 of them</param>
        /// <param name="options">lease, wait timeout, keep-alive...</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the held lock</returns>
        public Task<TicketingLock> AcquireAsync(byte[] key, AcquireOptions options, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AcquireCoreAsync(Args.Key(key), Check(options), cancellationToken);
        }

        /// <summary>
        /// Tries to acquire the lock within <paramref name="waitTimeout"/> (default: one try):
        /// null when not acquired, never <see cref="NotAcquiredException"/>.
        /// </summary>
        /// <param name="key">the key</param>
        /// <param name="lease">the lease</param>
        /// <param name="waitTimeout">how long to wait; default <see cref="TimeSpan.Zero"/> (one try)</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the lock, or null</returns>
        public Task<TicketingLock> TryAcquireAsync(string key, TimeSpan lease, TimeSpan waitTimeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken))
        {
            // Options made here need no defensive copy (Check's): nobody else holds them.
            return AcquireCoreAsync(Args.Key(key), Validate(new AcquireOptions(lease) { WaitTimeout = waitTimeout }), cancellationToken, true);
        }

        /// <summary>Tries to acquire with these options (their wait timeout applies): null when not acquired.</summary>
        /// <param name="key">the key</param>
        /// <param name="options">the options</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the lock, or null</returns>
        public Task<TicketingLock> TryAcquireAsync(string key, AcquireOptions options, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AcquireCoreAsync(Args.Key(key), Check(options), cancellationToken, true);
        }

        /// <summary>Tries to acquire a binary key: null when not acquired.</summary>
        /// <param name="key">the key's bytes</param>
        /// <param name="options">the options</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the lock, or null</returns>
        public Task<TicketingLock> TryAcquireAsync(byte[] key, AcquireOptions options, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AcquireCoreAsync(Args.Key(key), Check(options), cancellationToken, true);
        }

        /// <summary>Acquires and blocks; see <see cref="AcquireAsync(string, TimeSpan, TimeSpan?, CancellationToken)"/>.</summary>
        /// <param name="key">the key</param>
        /// <param name="lease">the lease</param>
        /// <param name="waitTimeout">null: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the held lock</returns>
        public TicketingLock Acquire(string key, TimeSpan lease, TimeSpan? waitTimeout = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AcquireAsync(key, lease, waitTimeout, cancellationToken).GetAwaiter().GetResult();
        }

        /// <summary>Tries to acquire and blocks: null when not acquired; see <see cref="TryAcquireAsync(string, TimeSpan, TimeSpan, CancellationToken)"/>.</summary>
        /// <param name="key">the key</param>
        /// <param name="lease">the lease</param>
        /// <param name="waitTimeout">how long to wait; default one try</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the lock, or null</returns>
        public TicketingLock TryAcquire(string key, TimeSpan lease, TimeSpan waitTimeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken))
        {
            return TryAcquireAsync(key, lease, waitTimeout, cancellationToken).GetAwaiter().GetResult();
        }

        /// <summary>
        /// Runs <paramref name="body"/> while holding the lock, then releases it. If the lock was
        /// lost while the body ran (the body may watch <see cref="TicketingLock.HandleLostToken"/>),
        /// it throws <see cref="LockLostException"/> once the body has finished, unless
        /// <see cref="AcquireOptions.ThrowOnLost"/> is false; an exception of the body itself wins,
        /// except a cancellation caused by the loss, which becomes <see cref="LockLostException"/>.
        /// </summary>
        /// <param name="key">the key</param>
        /// <param name="options">lease, wait timeout, keep-alive...</param>
        /// <param name="body">the work that needs the lock</param>
        /// <param name="cancellationToken">withdraws the wait for the lock</param>
        /// <returns>a task that completes after the release</returns>
        /// <exception cref="LockLostException">the lock was lost while the body ran</exception>
        public Task WithLockAsync(string key, AcquireOptions options, Func<TicketingLock, Task> body, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (body == null)
            {
                throw new ArgumentNullException(nameof(body));
            }
            return WithLockAsync<bool>(key, options, async l =>
            {
                await body(l).ConfigureAwait(false);
                return true;
            }, cancellationToken);
        }

        /// <summary>Runs <paramref name="body"/> while holding the lock and returns its result; see <see cref="WithLockAsync(string, AcquireOptions, Func{TicketingLock, Task}, CancellationToken)"/>.</summary>
        /// <typeparam name="T">the body's result</typeparam>
        /// <param name="key">the key</param>
        /// <param name="options">lease, wait timeout, keep-alive...</param>
        /// <param name="body">the work that needs the lock</param>
        /// <param name="cancellationToken">withdraws the wait for the lock</param>
        /// <returns>the body's result</returns>
        public Task<T> WithLockAsync<T>(string key, AcquireOptions options, Func<TicketingLock, Task<T>> body, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (body == null)
            {
                throw new ArgumentNullException(nameof(body));
            }
            byte[] k = Args.Key(key);
            AcquireOptions o = Check(options);
            return WithLockCoreAsync(k, o, body, cancellationToken);
        }

        private async Task<T> WithLockCoreAsync<T>(byte[] key, AcquireOptions o, Func<TicketingLock, Task<T>> body, CancellationToken cancellationToken)
        {
            TicketingLock l = await AcquireCoreAsync(key, o, cancellationToken).ConfigureAwait(false);
            T result = default(T);
            ExceptionDispatchInfo failure = null;
            try
            {
                result = await body(l).ConfigureAwait(false);
            }
            catch (Exception e)
            {
                failure = ExceptionDispatchInfo.Capture(e);
            }
            LockLostException lost = null;
            try
            {
                await l.ReleaseInternalAsync(false).ConfigureAwait(false);
            }
            catch (LockLostException e)
            {
                lost = e;
            }
            catch (Exception) when (failure != null)
            {
                // the body's own failure is the one to report
            }
            if (failure != null)
            {
                if (lost != null && o.ThrowOnLost && failure.SourceException is OperationCanceledException && l.HandleLostToken.IsCancellationRequested)
                {
                    throw lost;
                }
                failure.Throw();
            }
            if (lost != null && o.ThrowOnLost)
            {
                throw lost;
            }
            return result;
        }

        private static AcquireOptions Check(AcquireOptions options)
        {
            if (options == null)
            {
                throw new ArgumentNullException(nameof(options), "acquire options are required (new AcquireOptions(lease))");
            }
            return Validate(options.Copy());
        }

        /// <summary>Checks options the client owns (a copy, or made by the client); returns them.</summary>
        private static AcquireOptions Validate(AcquireOptions o)
        {
            Args.LeaseMs(o.Lease, "options.Lease");
            Args.WaitMs(o.WaitTimeout, "options.WaitTimeout");
            if (o.MaxHold != null && o.MaxHold.Value < TimeSpan.Zero)
            {
                throw new ArgumentOutOfRangeException("options.MaxHold", o.MaxHold.Value, "max hold must be >= 0");
            }
            return o;
        }

        /// <summary>
        /// Acquires; when not acquired within the wait timeout, throws <see cref="NotAcquiredException"/>,
        /// or returns null with <paramref name="orNull"/> (the try forms: no exception thrown and caught).
        /// </summary>
        private Task<TicketingLock> AcquireCoreAsync(byte[] key, AcquireOptions o, CancellationToken ct, bool orNull = false)
        {
            if (o.RefuseHeld || ct.CanBeCanceled)
            {
                return AcquireSlowAsync(key, o, ct, orNull);
            }
            // The common call (no token, no RefuseHeld): no async method. The answer is turned
            // into the lock by the call object itself where the answer is handled (the reader
            // thread, or the pool: Completions), and the caller's continuation runs there, as it
            // did after the async method's own await.
            var call = new AcquireCall(this, key, o, orNull);
            var r = new Request(Op.Acquire, key, 0, Args.LeaseMs(o.Lease), Args.WaitMs(o.WaitTimeout), false, call);
            try
            {
                _engine.Send(r);
            }
            catch (Exception e)
            {
                call.TrySetException(e); // as the async method would have: in the task, not thrown
            }
            return call.Task;
        }

        /// <summary>
        /// An acquire's task and its answer's handler in one object (<see cref="AcquireCoreAsync"/>'s
        /// common path). Its continuations run where it completes, as those of the request's answer did.
        /// </summary>
        private sealed class AcquireCall : TaskCompletionSource<TicketingLock>, IAnswerHandler
        {
            private readonly TicketingClient _client;
            private readonly byte[] _key;
            private readonly AcquireOptions _options;
            private readonly bool _orNull;

            internal AcquireCall(TicketingClient client, byte[] key, AcquireOptions options, bool orNull)
            {
                _client = client;
                _key = key;
                _options = options;
                _orNull = orNull;
            }

            public void OnAnswer(Request r, ResponseFrame f)
            {
                TicketingLock l;
                try
                {
                    l = _client.Granted(_key, _options, r, f, _orNull);
                }
                catch (Exception e)
                {
                    TrySetException(e);
                    return;
                }
                TrySetResult(l);
            }

            public void OnError(Request r, Exception e)
            {
                TrySetException(e);
            }
        }

        /// <summary>The acquire with a cancellation token or <see cref="AcquireOptions.RefuseHeld"/>.</summary>
        private async Task<TicketingLock> AcquireSlowAsync(byte[] key, AcquireOptions o, CancellationToken ct, bool orNull)
        {
            if (o.RefuseHeld && _engine.Holds(key))
            {
                throw new AlreadyHeldException("this client already holds " + Args.Printable(key) + " (RefuseHeld)");
            }
            ct.ThrowIfCancellationRequested();
            uint leaseMs = Args.LeaseMs(o.Lease);
            uint waitMs = Args.WaitMs(o.WaitTimeout);
            var r = new Request(Op.Acquire, key, 0, leaseMs, waitMs, false);
            Task<ResponseFrame> answer = _engine.Submit(r);
            ResponseFrame f;
            CancellationTokenRegistration reg = ct.CanBeCanceled ? AbandonOnCancel(r, key, ct) : default(CancellationTokenRegistration);
            try
            {
                f = await answer.ConfigureAwait(false);
            }
            catch (OperationCanceledException) when (ct.IsCancellationRequested)
            {
                // Wait (bounded) for the withdrawal, so that the caller may acquire again at once.
                await TimerQueue.Shared.WaitAsync(r.Settled, _engine.Opts.CleanupTimeout).ConfigureAwait(false);
                throw new OperationCanceledException("acquire of " + Args.Printable(key) + " was cancelled; the wait was withdrawn", ct);
            }
            finally
            {
                reg.Dispose();
            }
            return Granted(key, o, r, f, orNull);
        }

        /// <summary>
        /// What an acquire's answer means: the held lock, null (not acquired, with
        /// <paramref name="orNull"/>), or the exception thrown.
        /// </summary>
        private TicketingLock Granted(byte[] key, AcquireOptions o, Request r, ResponseFrame f, bool orNull)
        {
            uint waitMs = r.WaitMs;
            if (f.Status != Status.Ok)
            {
                // The key's text only now: formatting it for every call cost more than the rest of a call's own work.
                string text = Args.Printable(key);
                if (f.Status == Status.TimedOut)
                {
                    if (orNull)
                    {
                        return null;
                    }
                    string why = Args.Utf8(f.Data);
                    throw new NotAcquiredException(text + " not acquired within "
                        + (waitMs == 0 ? "a single try (wait 0)" : waitMs + " ms") + "; "
                        + (why.Length > 0 ? why : "it is held by another token")); // the server says why (its start-up wait)
                }
                if (f.Status == Status.NotHeld)
                {
                    throw new ConnectionLostException("acquire of " + text + " was interrupted by a lost connection and the"
                        + " server holds nothing for it; acquire again");
                }
                throw StatusError(f, "acquire of " + text);
            }
            return Adopt(key, null, r, f, o);
        }

        /// <summary>
        /// Withdraws <paramref name="r"/> when <paramref name="ct"/> is cancelled: a method of its own,
        /// as a lambda in <see cref="AcquireCoreAsync"/> made the compiler allocate its closure on every call.
        /// </summary>
        private CancellationTokenRegistration AbandonOnCancel(Request r, byte[] key, CancellationToken ct)
        {
            return ct.Register(() => _engine.Abandon(r, new OperationCanceledException("acquire of " + Args.Printable(key) + " was cancelled", ct)));
        }

        /// <summary>
        /// Turns an acquire's grant into a held lock, unless the client closed or the server
        /// restarted between the answer and this continuation. <paramref name="text"/>: the key for
        /// messages (null: formatted from <paramref name="key"/> when needed).
        /// </summary>
        internal TicketingLock Adopt(byte[] key, string text, Request r, ResponseFrame f, AcquireOptions o)
        {
            // Whichever transmission the answer is for, detail counts from the request's first
            // arrival, which came after its first send (PROTOCOL.md, "The lost signal").
            var l = new TicketingLock(_engine, key, f.Token, f.LeaseMs, f.Detail, r.FirstSent, o);
            switch (_engine.Register(l, r.Generation))
            {
                case Engine.Refusal.Closed:
                    text = text ?? Args.Printable(key);
                    // Close took its list of held locks before this grant was adopted: the lock
                    // runs out its lease on the server, or is released here when the client was
                    // to release on close and its connection is still open (best effort).
                    if (_engine.Opts.ReleaseOnClose)
                    {
                        try
                        {
                            l.ReleaseInternalAsync(true).ContinueWith(t => { var ignored = t.Exception; }, TaskContinuationOptions.ExecuteSynchronously);
                        }
                        catch (TicketingException)
                        {
                            // closed already: the lease runs out
                        }
                    }
                    throw new ClosedException("the client was closed while acquire of " + text + " was answered; the lock "
                        + (_engine.Opts.ReleaseOnClose ? "is released if the connection is still open, else it " : "")
                        + "runs out its lease on the server");
                case Engine.Refusal.Restarted:
                    text = text ?? Args.Printable(key);
                    l.MarkLost(LostReason.ServerRestarted);
                    throw new ServerRestartedException("the server restarted while acquire of " + text + " was answered");
            }
            l.Start();
            return l;
        }

        // ---- by key and token ----

        /// <summary>
        /// Releases the lock on <paramref name="key"/> held by <paramref name="token"/>, from any
        /// session (the owner is the token).
        /// </summary>
        /// <param name="key">the key</param>
        /// <param name="token">the holder's fencing token (non-zero)</param>
        /// <param name="cancellationToken">stops waiting for the answer</param>
        /// <returns>a task that completes once released</returns>
        /// <exception cref="NotHeldException">the token does not hold the key (nothing changes)</exception>
        public Task ReleaseAsync(string key, ulong token, CancellationToken cancellationToken = default(CancellationToken))
        {
            byte[] k = Args.Key(key);
            Args.Token(token);
            return WithCancellation(ByTokenAsync(Op.Release, k, token, 0), cancellationToken, () => "release of " + Args.Printable(k));
        }

        /// <summary>Sets the lease of the lock on <paramref name="key"/> held by <paramref name="token"/> to <paramref name="lease"/> from now.</summary>
        /// <param name="key">the key</param>
        /// <param name="token">the holder's token</param>
        /// <param name="lease">the new lease</param>
        /// <param name="cancellationToken">stops waiting for the answer</param>
        /// <returns>the lease granted</returns>
        /// <exception cref="NotHeldException">the token does not hold the key</exception>
        public Task<TimeSpan> ExtendAsync(string key, ulong token, TimeSpan lease, CancellationToken cancellationToken = default(CancellationToken))
        {
            byte[] k = Args.Key(key);
            Args.Token(token);
            uint ms = Args.LeaseMs(lease);
            return WithCancellation(ExtendCoreAsync(k, token, ms), cancellationToken, () => "extend of " + Args.Printable(k));
        }

        private async Task<TimeSpan> ExtendCoreAsync(byte[] key, ulong token, uint leaseMs)
        {
            ResponseFrame f = await ByTokenAsync(Op.Extend, key, token, leaseMs).ConfigureAwait(false);
            return TimeSpan.FromMilliseconds(f.LeaseMs);
        }

        private async Task<ResponseFrame> ByTokenAsync(Op op, byte[] key, ulong token, uint leaseMs)
        {
            ResponseFrame f = await _engine.Submit(new Request(op, key, token, leaseMs, 0, false)).ConfigureAwait(false);
            if (f.Status != Status.Ok)
            {
                throw StatusError(f, Dialer.Upper(op.ToString()).ToLowerInvariant() + " of " + Args.Printable(key) + " (token " + token + ")");
            }
            return f;
        }

        /// <summary>
        /// Asks the server about a key: held or not, lease left, waiters. The holder's token is shown
        /// only to the holding session, or when <paramref name="token"/> is the holder's.
        /// </summary>
        /// <param name="key">the key</param>
        /// <param name="token">a token to check, or 0</param>
        /// <param name="cancellationToken">stops waiting for the answer</param>
        /// <returns>what the server knows</returns>
        public Task<LockInfo> InspectAsync(string key, ulong token = 0, CancellationToken cancellationToken = default(CancellationToken))
        {
            byte[] k = Args.Key(key);
            return WithCancellation(InspectCoreAsync(_engine, k, token), cancellationToken, () => "inspect of " + Args.Printable(k));
        }

        internal static async Task<LockInfo> InspectCoreAsync(Engine engine, byte[] key, ulong token)
        {
            ResponseFrame f = await engine.Submit(new Request(Op.Inspect, key, token, 0, 0, false)).ConfigureAwait(false);
            if (f.Status != Status.Ok)
            {
                throw StatusError(f, "inspect of " + Args.Printable(key));
            }
            byte[] d = f.Data.Length >= Wire.InspectData ? f.Data : new byte[Wire.InspectData];
            return new LockInfo(f.Token, f.LeaseMs, f.Detail, BigEndian.ReadUInt32(d, 0), BigEndian.ReadUInt32(d, 4), (InspectFlags)BigEndian.ReadUInt32(d, 8));
        }

        /// <summary>Sends <c>PING</c> and waits for the answer.</summary>
        /// <param name="cancellationToken">stops waiting</param>
        /// <returns>the round-trip time</returns>
        public async Task<TimeSpan> PingAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            long t0 = Clock.Now;
            ResponseFrame f = await WithCancellation(_engine.Submit(new Request(Op.Ping, null, 0, 0, 0, false)), cancellationToken, () => "ping").ConfigureAwait(false);
            if (f.Status != Status.Ok)
            {
                throw StatusError(f, "ping");
            }
            return Clock.ToTimeSpan(Clock.Now - t0);
        }

        // ---- closing ----

        /// <summary>
        /// Closes the client: queued acquires are withdrawn (bounded by the cleanup and request
        /// timeouts), pending calls fail with <see cref="ClosedException"/>, and the connection
        /// closes. Held locks are <b>not</b> released unless <see cref="TicketingOptions.ReleaseOnClose"/>
        /// is set: the server keeps them until their leases end (their local deadlines still fire).
        /// Idempotent.
        /// </summary>
        /// <returns>a task that completes once closed</returns>
        public Task CloseAsync()
        {
            return _engine.CloseAsync();
        }

        /// <summary>Closes the client; see <see cref="CloseAsync"/>.</summary>
        /// <returns>a task that completes once closed</returns>
        public ValueTask DisposeAsync()
        {
            return new ValueTask(_engine.CloseAsync());
        }

        /// <summary>Closes the client and blocks until closed; see <see cref="CloseAsync"/>.</summary>
        public void Dispose()
        {
            _engine.CloseAsync().GetAwaiter().GetResult();
        }

        /// <inheritdoc/>
        public override string ToString()
        {
            return "TicketingClient{session=" + SessionId + ", endpoints=" + string.Join(",", _engine.Opts.Endpoints) + "}";
        }

        // ---- helpers ----

        /// <summary>
        /// <paramref name="task"/>, or a task that throws <see cref="OperationCanceledException"/>
        /// when the token fires first (the request goes on). Without a token that can be
        /// cancelled, the task itself: no extra async layer. <paramref name="what"/> names the
        /// call in the message (formatted only then).
        /// </summary>
        internal static Task<T> WithCancellation<T>(Task<T> task, CancellationToken ct, Func<string> what)
        {
            return !ct.CanBeCanceled || task.IsCompleted ? task : WithCancellationCore(task, ct, what);
        }

        /// <summary>See <see cref="WithCancellation{T}(Task{T}, CancellationToken, Func{string})"/>.</summary>
        internal static Task WithCancellation(Task task, CancellationToken ct, Func<string> what)
        {
            return !ct.CanBeCanceled || task.IsCompleted ? task : WithCancellationCore(task, ct, what);
        }

        private static async Task<T> WithCancellationCore<T>(Task<T> task, CancellationToken ct, Func<string> what)
        {
            var cancelled = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            using (ct.Register(() => cancelled.TrySetResult(true)))
            {
                if (await Task.WhenAny(task, cancelled.Task).ConfigureAwait(false) != task)
                {
                    Observe(task);
                    throw new OperationCanceledException(what() + " was cancelled (the request may still complete on the server)", ct);
                }
            }
            return await task.ConfigureAwait(false);
        }

        private static async Task WithCancellationCore(Task task, CancellationToken ct, Func<string> what)
        {
            var cancelled = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            using (ct.Register(() => cancelled.TrySetResult(true)))
            {
                if (await Task.WhenAny(task, cancelled.Task).ConfigureAwait(false) != task)
                {
                    Observe(task);
                    throw new OperationCanceledException(what() + " was cancelled (the request may still complete on the server)", ct);
                }
            }
            await task.ConfigureAwait(false);
        }

        private static void Observe(Task t)
        {
            t.ContinueWith(x => { var ignored = x.Exception; }, TaskContinuationOptions.OnlyOnFaulted | TaskContinuationOptions.ExecuteSynchronously);
        }

        /// <summary>The error for a non-OK answer.</summary>
        internal static Exception StatusError(ResponseFrame f, string what)
        {
            string msg = Args.Utf8(f.Data);
            string suffix = msg.Length == 0 ? "" : ": " + msg;
            switch (f.Status)
            {
                case Status.TimedOut:
                    return new NotAcquiredException(what + " timed out in the queue");
                case Status.NotHeld:
                    return new NotHeldException(what + ": the token does not hold the key");
                case Status.Invalid:
                    return new InvalidRequestException(what + " rejected by the server (" + Dialer.FieldName(f.Detail) + ")" + suffix, (InvalidField)f.Detail);
                case Status.Busy:
                    return new BusyException(what + ": server limit reached (" + Dialer.LimitName(f.Detail) + ")" + suffix, (BusyLimit)f.Detail);
                case Status.ShuttingDown:
                    return new ShuttingDownException(what + ": the server is shutting down");
                case Status.Cancelled:
                    return new OperationCanceledException(what + " was withdrawn (CANCELLED)");
                case Status.AuthFailed:
                    return new AuthFailedException(what + ": authentication failed" + suffix);
                case Status.UnsupportedVersion:
                    return new UnsupportedVersionException(what + ": unsupported version" + suffix);
                default:
                    return new ProtocolException(what + " failed with " + (Enum.IsDefined(typeof(Status), f.Status) ? "status " + Dialer.StatusName(f.Status) : "unknown status " + (int)f.Status) + suffix);
            }
        }
    }
}
