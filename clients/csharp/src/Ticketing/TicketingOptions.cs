using System;
using System.Collections.Generic;
using System.Text;

namespace Ticketing
{
    /// <summary>
    /// How a <see cref="TicketingClient"/> connects and behaves. Every setting has a documented
    /// default; the client takes a copy when it connects, so changing the object later has no effect.
    /// </summary>
    public sealed class TicketingOptions
    {
        /// <summary>The default endpoint: <c>127.0.0.1:7070</c>.</summary>
        public const string DefaultEndpoint = "127.0.0.1:7070";

        /// <summary>The default connect timeout: 5 s.</summary>
        public static readonly TimeSpan DefaultConnectTimeout = TimeSpan.FromSeconds(5);

        /// <summary>The default request timeout: 10 s.</summary>
        public static readonly TimeSpan DefaultRequestTimeout = TimeSpan.FromSeconds(10);

        /// <summary>The default heartbeat interval: 2 s.</summary>
        public static readonly TimeSpan DefaultHeartbeatInterval = TimeSpan.FromSeconds(2);

        /// <summary>The default first reconnect backoff: 50 ms.</summary>
        public static readonly TimeSpan DefaultReconnectBackoffMin = TimeSpan.FromMilliseconds(50);

        /// <summary>The default longest reconnect backoff: 2 s.</summary>
        public static readonly TimeSpan DefaultReconnectBackoffMax = TimeSpan.FromSeconds(2);

        /// <summary>The default cleanup timeout: 5 s.</summary>
        public static readonly TimeSpan DefaultCleanupTimeout = TimeSpan.FromSeconds(5);

        /// <summary>
        /// Server addresses (<c>host:port</c>, <c>[v6]:port</c>), tried in order; a cluster's leader
        /// hint is tried first when known. Empty (or null): <see cref="DefaultEndpoint"/>.
        /// Default: empty, so that <c>Endpoints = { "host:port" }</c> names exactly that endpoint.
        /// </summary>
        public IList<string> Endpoints { get; set; } = new List<string>();

        /// <summary>
        /// The shared auth token (its UTF-8 bytes key the HMAC), or null. With a token, a server that
        /// does not require one is refused: it could not prove that it holds the token. Default: null.
        /// </summary>
        public string Token { get; set; }

        /// <summary>TLS settings, or null for plaintext. Default: null.</summary>
        public TlsOptions Tls { get; set; }

        /// <summary>
        /// TCP connect, TLS and handshake, per endpoint; once TCP is connected, TLS and the handshake
        /// must also finish within 2 s (a frozen node's kernel still accepts connections). Default: 5 s.
        /// </summary>
        public TimeSpan ConnectTimeout { get; set; } = DefaultConnectTimeout;

        /// <summary>
        /// How long any request waits for its answer, <b>except</b> the time an acquire spends queued
        /// (bounded by its wait timeout and the heartbeat instead), also while the client reconnects
        /// (a fail-fast caller sets a short one); also how long the first connect keeps trying while
        /// a cluster elects a leader. Default: 10 s.
        /// </summary>
        public TimeSpan RequestTimeout { get; set; } = DefaultRequestTimeout;

        /// <summary>
        /// After this long without receiving anything the client sends <c>PING</c> (after 250 ms at
        /// most while any request waits for its answer, a queued acquire included); a <c>PING</c>
        /// unanswered within min(heartbeat, 750 ms) replaces the connection: the session resumes on
        /// the next one (for 2 s the endpoint just left is neither dialled nor followed as a leader
        /// hint, unless it is the only one; then it is tried last) and the calls in flight keep
        /// waiting.
        /// <see cref="TimeSpan.Zero"/> turns it off. Default: 2 s.
        /// </summary>
        public TimeSpan HeartbeatInterval { get; set; } = DefaultHeartbeatInterval;

        /// <summary>The first pause between reconnect rounds; it doubles up to <see cref="ReconnectBackoffMax"/>, with jitter. Default: 50 ms.</summary>
        public TimeSpan ReconnectBackoffMin { get; set; } = DefaultReconnectBackoffMin;

        /// <summary>The longest pause between reconnect rounds. Default: 2 s.</summary>
        public TimeSpan ReconnectBackoffMax { get; set; } = DefaultReconnectBackoffMax;

        /// <summary>
        /// How long a cancelled acquire waits for its withdrawal (the <c>CANCEL</c> answer, and the
        /// release of a grant that raced it) before it throws; the clean-up then finishes in the
        /// background. Default: 5 s.
        /// </summary>
        public TimeSpan CleanupTimeout { get; set; } = DefaultCleanupTimeout;

        /// <summary>
        /// When true, closing the client releases every lock it still holds (bounded by the request
        /// timeout). When false, held locks run out their leases on the server. Default: false.
        /// </summary>
        public bool ReleaseOnClose { get; set; }

        /// <summary>The clock of lock deadlines (a test gives one whose suspend time it sets).</summary>
        internal SuspendClock DeadlineClock { get; set; } = SuspendClock.Host;

        /// <summary>Returns a copy of these options.</summary>
        /// <returns>a new object with the same settings</returns>
        public TicketingOptions Clone()
        {
            var c = (TicketingOptions)MemberwiseClone();
            c.Endpoints = Endpoints == null ? new List<string>() : new List<string>(Endpoints);
            return c;
        }

        internal Settings Validate()
        {
            var s = new Settings();
            foreach (string e in Endpoints == null || Endpoints.Count == 0 ? new List<string> { DefaultEndpoint } : Endpoints)
            {
                s.Endpoints.Add(Endpoint.Parse(e));
            }
            s.Token = Token == null ? null : Encoding.UTF8.GetBytes(Token);
            s.Tls = Tls?.Copy();
            s.ConnectTimeout = Positive(ConnectTimeout, nameof(ConnectTimeout));
            s.RequestTimeout = Positive(RequestTimeout, nameof(RequestTimeout));
            if (HeartbeatInterval < TimeSpan.Zero)
            {
                throw new ArgumentOutOfRangeException(nameof(HeartbeatInterval), HeartbeatInterval, "heartbeat interval must be >= 0 (zero turns it off)");
            }
            s.HeartbeatInterval = HeartbeatInterval;
            s.BackoffMin = Positive(ReconnectBackoffMin, nameof(ReconnectBackoffMin));
            s.BackoffMax = Positive(ReconnectBackoffMax, nameof(ReconnectBackoffMax));
            if (s.BackoffMax < s.BackoffMin)
            {
                throw new ArgumentOutOfRangeException(nameof(ReconnectBackoffMax), ReconnectBackoffMax, "the longest reconnect backoff must not be below the first");
            }
            if (CleanupTimeout < TimeSpan.Zero)
            {
                throw new ArgumentOutOfRangeException(nameof(CleanupTimeout), CleanupTimeout, "cleanup timeout must be >= 0");
            }
            s.CleanupTimeout = CleanupTimeout;
            s.ReleaseOnClose = ReleaseOnClose;
            s.DeadlineClock = DeadlineClock;
            return s;
        }

        private static TimeSpan Positive(TimeSpan t, string name)
        {
            if (t.Ticks < TimeSpan.TicksPerMillisecond || t.TotalMilliseconds > int.MaxValue)
            {
                throw new ArgumentOutOfRangeException(name, t, name + " must be between 1 ms and about 24 days, got " + Args.Describe(t));
            }
            return t;
        }
    }

    /// <summary>The validated copy of <see cref="TicketingOptions"/> a client runs with.</summary>
    internal sealed class Settings
    {
        internal readonly List<Endpoint> Endpoints = new List<Endpoint>();
        internal byte[] Token;
        internal TlsOptions Tls;
        internal TimeSpan ConnectTimeout;
        internal TimeSpan RequestTimeout;
        internal TimeSpan HeartbeatInterval;
        internal TimeSpan BackoffMin;
        internal TimeSpan BackoffMax;
        internal TimeSpan CleanupTimeout;
        internal bool ReleaseOnClose;
        internal SuspendClock DeadlineClock;
    }

    /// <summary>
    /// Per-acquire settings beyond the key and lease: wait timeout, keep-alive, refuse-held, and
    /// whether a scoped lock reports a loss.
    /// </summary>
    public sealed class AcquireOptions
    {
        /// <summary>Creates the options for a lease.</summary>
        /// <param name="lease">how long the lock is held unless released or extended; at least 1 ms</param>
        public AcquireOptions(TimeSpan lease)
        {
            Lease = lease;
        }

        /// <summary>The lease: starts when the lock is granted (for a waiter: at the hand-off).</summary>
        public TimeSpan Lease { get; set; }

        /// <summary>
        /// How long to wait in the key's FIFO queue: null (or <see cref="System.Threading.Timeout.InfiniteTimeSpan"/>)
        /// waits without limit, <see cref="TimeSpan.Zero"/> tries once. Default: null.
        /// </summary>
        public TimeSpan? WaitTimeout { get; set; }

        /// <summary>When true, the lock is extended by its lease every lease/3 until released or lost. Default: false.</summary>
        public bool KeepAlive { get; set; }

        /// <summary>With keep-alive: stop extending after this long; the lock then runs out its lease. Default: null (no cap).</summary>
        public TimeSpan? MaxHold { get; set; }

        /// <summary>
        /// When true, acquiring a key this client already holds fails at once with
        /// <see cref="AlreadyHeldException"/> instead of queueing behind itself. Default: false.
        /// </summary>
        public bool RefuseHeld { get; set; }

        /// <summary>
        /// When true, disposing a lock that was lost (and <see cref="TicketingClient.WithLockAsync(string, AcquireOptions, Func{TicketingLock, System.Threading.Tasks.Task}, System.Threading.CancellationToken)"/>)
        /// throws <see cref="LockLostException"/>. Default: true.
        /// </summary>
        public bool ThrowOnLost { get; set; } = true;

        internal AcquireOptions Copy()
        {
            return (AcquireOptions)MemberwiseClone();
        }
    }
}
