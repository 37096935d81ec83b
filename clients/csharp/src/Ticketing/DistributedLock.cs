using System;
using System.Threading;
using System.Threading.Tasks;

// The lock-provider abstraction in the shape of Medallion's DistributedLock (DistributedLock.Core,
// namespace Medallion.Threading), declared here so that this package depends on nothing: code
// written against Medallion's IDistributedLockProvider switches by changing its using directive
// to Ticketing.Threading and constructing a TicketingDistributedLockProvider.
namespace Ticketing.Threading
{
    /// <summary>
    /// Creates named locks; the same shape as Medallion's <c>IDistributedLockProvider</c>.
    /// Implemented by <see cref="TicketingDistributedLockProvider"/>.
    /// </summary>
    public interface IDistributedLockProvider
    {
        /// <summary>Creates a lock named <paramref name="name"/>; nothing is sent until it is acquired.</summary>
        /// <param name="name">the lock's name</param>
        /// <returns>the lock</returns>
        IDistributedLock CreateLock(string name);
    }

    /// <summary>A named lock; the same shape as Medallion's <c>IDistributedLock</c>.</summary>
    public interface IDistributedLock
    {
        /// <summary>The lock's name.</summary>
        string Name { get; }

        /// <summary>Tries to acquire the lock within <paramref name="timeout"/> (default: one try); null when not acquired.</summary>
        /// <param name="timeout">how long to wait; <see cref="TimeSpan.Zero"/>: one try; <see cref="Timeout.InfiniteTimeSpan"/>: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle that holds the lock until disposed, or null</returns>
        IDistributedSynchronizationHandle TryAcquire(TimeSpan timeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken));

        /// <summary>Acquires the lock, waiting at most <paramref name="timeout"/> (null: without limit).</summary>
        /// <param name="timeout">how long to wait; null: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle that holds the lock until disposed</returns>
        /// <exception cref="TimeoutException">the timeout passed; nothing is held</exception>
        IDistributedSynchronizationHandle Acquire(TimeSpan? timeout = null, CancellationToken cancellationToken = default(CancellationToken));

        /// <summary>Tries to acquire the lock within <paramref name="timeout"/> (default: one try); null when not acquired.</summary>
        /// <param name="timeout">how long to wait; <see cref="TimeSpan.Zero"/>: one try; <see cref="Timeout.InfiniteTimeSpan"/>: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle that holds the lock until disposed, or null</returns>
        ValueTask<IDistributedSynchronizationHandle> TryAcquireAsync(TimeSpan timeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken));

        /// <summary>Acquires the lock, waiting at most <paramref name="timeout"/> (null: without limit).</summary>
        /// <param name="timeout">how long to wait; null: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle that holds the lock until disposed</returns>
        /// <exception cref="TimeoutException">the timeout passed; nothing is held</exception>
        ValueTask<IDistributedSynchronizationHandle> AcquireAsync(TimeSpan? timeout = null, CancellationToken cancellationToken = default(CancellationToken));
    }

    /// <summary>
    /// A held lock: disposing it releases the lock; the same shape as Medallion's
    /// <c>IDistributedSynchronizationHandle</c>. <see cref="TicketingLock"/> implements it.
    /// </summary>
    public interface IDistributedSynchronizationHandle : IDisposable, IAsyncDisposable
    {
        /// <summary>Cancelled when the lock is lost (its lease ran out, the server restarted...); never after a release.</summary>
        CancellationToken HandleLostToken { get; }
    }

    /// <summary>The one-call forms of Medallion's <c>DistributedLockProviderExtensions</c>: create the lock and acquire it.</summary>
    public static class DistributedLockProviderExtensions
    {
        /// <summary><see cref="IDistributedLockProvider.CreateLock(string)"/>, then <see cref="IDistributedLock.TryAcquire(TimeSpan, CancellationToken)"/>.</summary>
        /// <param name="provider">the provider</param>
        /// <param name="name">the lock's name</param>
        /// <param name="timeout">how long to wait; default one try</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle, or null</returns>
        public static IDistributedSynchronizationHandle TryAcquireLock(this IDistributedLockProvider provider, string name, TimeSpan timeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken))
        {
            return NotNull(provider).CreateLock(name).TryAcquire(timeout, cancellationToken);
        }

        /// <summary><see cref="IDistributedLockProvider.CreateLock(string)"/>, then <see cref="IDistributedLock.Acquire(TimeSpan?, CancellationToken)"/>.</summary>
        /// <param name="provider">the provider</param>
        /// <param name="name">the lock's name</param>
        /// <param name="timeout">how long to wait; null: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle</returns>
        public static IDistributedSynchronizationHandle AcquireLock(this IDistributedLockProvider provider, string name, TimeSpan? timeout = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            return NotNull(provider).CreateLock(name).Acquire(timeout, cancellationToken);
        }

        /// <summary><see cref="IDistributedLockProvider.CreateLock(string)"/>, then <see cref="IDistributedLock.TryAcquireAsync(TimeSpan, CancellationToken)"/>.</summary>
        /// <param name="provider">the provider</param>
        /// <param name="name">the lock's name</param>
        /// <param name="timeout">how long to wait; default one try</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle, or null</returns>
        public static ValueTask<IDistributedSynchronizationHandle> TryAcquireLockAsync(this IDistributedLockProvider provider, string name, TimeSpan timeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken))
        {
            return NotNull(provider).CreateLock(name).TryAcquireAsync(timeout, cancellationToken);
        }

        /// <summary><see cref="IDistributedLockProvider.CreateLock(string)"/>, then <see cref="IDistributedLock.AcquireAsync(TimeSpan?, CancellationToken)"/>.</summary>
        /// <param name="provider">the provider</param>
        /// <param name="name">the lock's name</param>
        /// <param name="timeout">how long to wait; null: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the handle</returns>
        public static ValueTask<IDistributedSynchronizationHandle> AcquireLockAsync(this IDistributedLockProvider provider, string name, TimeSpan? timeout = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            return NotNull(provider).CreateLock(name).AcquireAsync(timeout, cancellationToken);
        }

        private static IDistributedLockProvider NotNull(IDistributedLockProvider provider)
        {
            if (provider == null)
            {
                throw new ArgumentNullException(nameof(provider));
            }
            return provider;
        }
    }

    /// <summary>
    /// An <see cref="IDistributedLockProvider"/> over one <see cref="TicketingClient"/>: each lock's
    /// name is its key. By default a lock is held until its handle is disposed, as Medallion's
    /// locks are: a lease of <see cref="DefaultLease"/> kept alive (extended every lease/3) while
    /// held; if it is lost anyway, <see cref="IDistributedSynchronizationHandle.HandleLostToken"/>
    /// is cancelled. The handles are <see cref="TicketingLock"/>s, with the fencing token.
    /// The provider does not own the client: close the client yourself.
    /// </summary>
    public sealed class TicketingDistributedLockProvider : IDistributedLockProvider
    {
        /// <summary>The default lease, 30 s, kept alive while held.</summary>
        public static readonly TimeSpan DefaultLease = TimeSpan.FromSeconds(30);

        private readonly AcquireOptions _options;

        /// <summary>A provider whose locks have a lease of <see cref="DefaultLease"/>, kept alive while held.</summary>
        /// <param name="client">the client every lock goes through</param>
        public TicketingDistributedLockProvider(TicketingClient client)
            : this(client, new AcquireOptions(DefaultLease) { KeepAlive = true })
        {
        }

        /// <summary>
        /// A provider whose locks are acquired with a copy of <paramref name="options"/> (lease,
        /// keep-alive, max hold, refuse-held, throw-on-lost); its wait timeout is ignored: each
        /// call's timeout applies.
        /// </summary>
        /// <param name="client">the client every lock goes through</param>
        /// <param name="options">the acquire options of every lock</param>
        public TicketingDistributedLockProvider(TicketingClient client, AcquireOptions options)
        {
            if (client == null)
            {
                throw new ArgumentNullException(nameof(client));
            }
            if (options == null)
            {
                throw new ArgumentNullException(nameof(options));
            }
            Args.LeaseMs(options.Lease, "options.Lease");
            Client = client;
            _options = options.Copy();
        }

        /// <summary>The client every lock goes through.</summary>
        public TicketingClient Client { get; }

        /// <summary>Creates the lock on key <paramref name="name"/>; nothing is sent until it is acquired.</summary>
        /// <param name="name">the key: non-empty, at most 65,535 UTF-8 bytes</param>
        /// <returns>the lock</returns>
        /// <exception cref="ArgumentException">a bad name</exception>
        public TicketingDistributedLock CreateLock(string name)
        {
            byte[] key = Args.Key(name, nameof(name));
            return new TicketingDistributedLock(Client, name, key, _options);
        }

        IDistributedLock IDistributedLockProvider.CreateLock(string name)
        {
            return CreateLock(name);
        }
    }

    /// <summary>
    /// A named lock of a <see cref="TicketingDistributedLockProvider"/>; it may be acquired any
    /// number of times, each acquire giving a new <see cref="TicketingLock"/> handle. Acquiring
    /// it again while this client holds it waits behind the holder (as every Ticketing acquire).
    /// </summary>
    public sealed class TicketingDistributedLock : IDistributedLock
    {
        private readonly TicketingClient _client;
        private readonly AcquireOptions _options;
        private readonly byte[] _key;

        internal TicketingDistributedLock(TicketingClient client, string name, byte[] key, AcquireOptions options)
        {
            _client = client;
            _key = key;
            Name = name;
            _options = options;
        }

        /// <summary>The lock's name: its key on the server.</summary>
        public string Name { get; }

        /// <summary>Tries to acquire the lock within <paramref name="timeout"/> (default: one try).</summary>
        /// <param name="timeout">how long to wait; <see cref="TimeSpan.Zero"/>: one try; <see cref="Timeout.InfiniteTimeSpan"/>: without limit</param>
        /// <param name="cancellationToken">withdraws the wait (a grant that raced it is released)</param>
        /// <returns>the held lock, or null when not acquired</returns>
        /// <exception cref="TicketingException">a server or connection error</exception>
        public Task<TicketingLock> TryAcquireAsync(TimeSpan timeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken))
        {
            return _client.TryAcquireAsync(_key, With(timeout), cancellationToken);
        }

        /// <summary>Acquires the lock, waiting at most <paramref name="timeout"/> (null: without limit).</summary>
        /// <param name="timeout">how long to wait; null or <see cref="Timeout.InfiniteTimeSpan"/>: without limit</param>
        /// <param name="cancellationToken">withdraws the wait (a grant that raced it is released)</param>
        /// <returns>the held lock</returns>
        /// <exception cref="TimeoutException">the timeout passed; nothing is held (its inner exception is the <see cref="NotAcquiredException"/>)</exception>
        /// <exception cref="TicketingException">a server or connection error</exception>
        public async Task<TicketingLock> AcquireAsync(TimeSpan? timeout = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            AcquireOptions o = With(timeout);
            try
            {
                return await _client.AcquireAsync(_key, o, cancellationToken).ConfigureAwait(false);
            }
            catch (NotAcquiredException e)
            {
                throw new TimeoutException("Timeout exceeded when trying to acquire the lock: " + e.Message, e);
            }
        }

        /// <summary>Tries to acquire the lock and blocks; see <see cref="TryAcquireAsync(TimeSpan, CancellationToken)"/>.</summary>
        /// <param name="timeout">how long to wait; default one try</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the held lock, or null</returns>
        public TicketingLock TryAcquire(TimeSpan timeout = default(TimeSpan), CancellationToken cancellationToken = default(CancellationToken))
        {
            return TryAcquireAsync(timeout, cancellationToken).GetAwaiter().GetResult();
        }

        /// <summary>Acquires the lock and blocks; see <see cref="AcquireAsync(TimeSpan?, CancellationToken)"/>.</summary>
        /// <param name="timeout">how long to wait; null: without limit</param>
        /// <param name="cancellationToken">withdraws the wait</param>
        /// <returns>the held lock</returns>
        /// <exception cref="TimeoutException">the timeout passed; nothing is held</exception>
        public TicketingLock Acquire(TimeSpan? timeout = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AcquireAsync(timeout, cancellationToken).GetAwaiter().GetResult();
        }

        IDistributedSynchronizationHandle IDistributedLock.TryAcquire(TimeSpan timeout, CancellationToken cancellationToken)
        {
            return TryAcquire(timeout, cancellationToken);
        }

        IDistributedSynchronizationHandle IDistributedLock.Acquire(TimeSpan? timeout, CancellationToken cancellationToken)
        {
            return Acquire(timeout, cancellationToken);
        }

        ValueTask<IDistributedSynchronizationHandle> IDistributedLock.TryAcquireAsync(TimeSpan timeout, CancellationToken cancellationToken)
        {
            return new ValueTask<IDistributedSynchronizationHandle>(AsHandle(TryAcquireAsync(timeout, cancellationToken)));
        }

        ValueTask<IDistributedSynchronizationHandle> IDistributedLock.AcquireAsync(TimeSpan? timeout, CancellationToken cancellationToken)
        {
            return new ValueTask<IDistributedSynchronizationHandle>(AsHandle(AcquireAsync(timeout, cancellationToken)));
        }

        /// <summary>The lock's name.</summary>
        /// <returns>the name, quoted</returns>
        public override string ToString()
        {
            return "TicketingDistributedLock(" + Args.Printable(_key) + ")";
        }

        private static async Task<IDistributedSynchronizationHandle> AsHandle(Task<TicketingLock> acquire)
        {
            return await acquire.ConfigureAwait(false);
        }

        private AcquireOptions With(TimeSpan? timeout)
        {
            AcquireOptions o = _options.Copy();
            o.WaitTimeout = timeout;
            return o;
        }
    }
}
