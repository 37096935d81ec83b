namespace Ticketing
{
    /// <summary>Why a held lock is lost (the same names in every Ticketing client).</summary>
    public enum LostReason
    {
        /// <summary>"expired": the local deadline passed, or the server reclaimed the lock (<c>EXPIRED</c> reason <c>LEASE</c>).</summary>
        Expired,

        /// <summary>"not held": the server answered <c>NOT_HELD</c> to an extend or release of the lock.</summary>
        NotHeld,

        /// <summary>"server restarted": a reconnect found a different state id; the server forgot every lock.</summary>
        ServerRestarted,

        /// <summary>"server stopping": the server is stopping (<c>EXPIRED</c> reason <c>STOPPING</c>).</summary>
        ServerStopping,
    }

    /// <summary>Text forms of <see cref="LostReason"/>.</summary>
    public static class LostReasonExtensions
    {
        /// <summary>Returns the reason as every client writes it: "expired", "not held", "server restarted", "server stopping".</summary>
        /// <param name="reason">the reason</param>
        /// <returns>the text</returns>
        public static string ToText(this LostReason reason)
        {
            switch (reason)
            {
                case LostReason.Expired:
                    return "expired";
                case LostReason.NotHeld:
                    return "not held";
                case LostReason.ServerRestarted:
                    return "server restarted";
                case LostReason.ServerStopping:
                    return "server stopping";
                default:
                    return "lost (" + (int)reason + ")";
            }
        }
    }
}
