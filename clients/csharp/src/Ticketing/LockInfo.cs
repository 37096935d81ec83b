using System;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>What the server reports about a key (<c>INSPECT</c>); it changes nothing.</summary>
    public sealed class LockInfo
    {
        internal LockInfo(ulong token, uint leaseLeftMs, uint waiters, uint heldForMs, uint lockDelayLeftMs, InspectFlags flags)
        {
            Token = token;
            LeaseLeft = TimeSpan.FromMilliseconds(leaseLeftMs);
            Waiters = waiters;
            HeldFor = TimeSpan.FromMilliseconds(heldForMs);
            LockDelayLeft = TimeSpan.FromMilliseconds(lockDelayLeftMs);
            Flags = flags;
        }

        /// <summary>Tells whether somebody holds the key.</summary>
        public bool Held => (Flags & InspectFlags.Held) != 0;

        /// <summary>The holder's token, shown only to the holding session or to a request carrying that token; else 0.</summary>
        public ulong Token { get; }

        /// <summary>Time left on the holder's lease.</summary>
        public TimeSpan LeaseLeft { get; }

        /// <summary>Acquires queued on the key.</summary>
        public long Waiters { get; }

        /// <summary>How long the holder has held the key.</summary>
        public TimeSpan HeldFor { get; }

        /// <summary>Lock-delay left after an expiry, or the start-up wait left (<see cref="InStartupWait"/>): the key is unavailable meanwhile.</summary>
        public TimeSpan LockDelayLeft { get; }

        /// <summary>The raw flags.</summary>
        public InspectFlags Flags { get; }

        /// <summary>Tells whether the token given to the inspect holds the key.</summary>
        public bool TokenMatches => (Flags & InspectFlags.TokenMatch) != 0;

        /// <summary>
        /// Tells whether the server is in its start-up wait (a restarted single node waits until
        /// every lease granted before the restart has ended): no key is granted before it ends, and
        /// <see cref="LockDelayLeft"/> is the time left.
        /// </summary>
        public bool InStartupWait => (Flags & InspectFlags.Startup) != 0;

        /// <summary>Tells whether this client's session holds the key.</summary>
        public bool HeldByThisSession => (Flags & InspectFlags.Session) != 0;

        /// <inheritdoc/>
        public override string ToString()
        {
            return "LockInfo{held=" + Held + ", token=" + Token + ", leaseLeft=" + (long)LeaseLeft.TotalMilliseconds + "ms, waiters=" + Waiters + ", flags=" + Flags + "}";
        }
    }
}
