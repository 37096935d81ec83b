namespace Ticketing.Protocol
{
    /// <summary>
    /// Sizes, limits and client rules of protocol version 1 (PROTOCOL.md). A test checks every
    /// value against <c>protocol/constants.json</c>.
    /// </summary>
    public static class Wire
    {
        /// <summary>The protocol version this client speaks (sent in <c>HELLO</c>).</summary>
        public const byte Version = 1;

        /// <summary>Bytes of the header of every frame after the handshake (length field included).</summary>
        public const int Header = 32;

        /// <summary>Bytes of a <c>HELLO</c> frame.</summary>
        public const int Hello = 56;

        /// <summary>Bytes of a <c>CHALLENGE</c> frame without its data.</summary>
        public const int Challenge = 48;

        /// <summary>Bytes of an <c>AUTH</c> frame.</summary>
        public const int Auth = 40;

        /// <summary>Bytes of a <c>WELCOME</c> frame.</summary>
        public const int Welcome = 64;

        /// <summary>The most data a <c>CHALLENGE</c> carries.</summary>
        public const int MaxChallengeData = 1024;

        /// <summary>The most bytes of key or data after a header (the format's ceiling).</summary>
        public const int MaxDataLen = 65535;

        /// <summary>The longest key the format can carry (servers have a lower limit, 256 by default).</summary>
        public const int MaxKeyLen = 65535;

        /// <summary>Bytes of a session id.</summary>
        public const int SessionId = 16;

        /// <summary>Bytes of a state id.</summary>
        public const int StateId = 16;

        /// <summary>Bytes of a nonce.</summary>
        public const int Nonce = 32;

        /// <summary>Bytes of an HMAC-SHA256 proof.</summary>
        public const int Proof = 32;

        /// <summary>Bytes of the data of an <c>INSPECT</c> answer.</summary>
        public const int InspectData = 12;

        /// <summary>The <c>wait_ms</c> that means "wait without limit".</summary>
        public const uint WaitForever = 0xFFFFFFFF;

        /// <summary><c>CHALLENGE</c> flag: the server holds a token and requires a proof.</summary>
        public const byte ChallengeAuthRequired = 1;

        /// <summary><c>WELCOME</c> flag: the session named in <c>HELLO</c> was resumed.</summary>
        public const byte WelcomeResumed = 1;

        /// <summary>A client sends <c>ACK</c> at least once per this many answers.</summary>
        public const int AckEvery = 1024;

        /// <summary>The bound on the rate error of each clock, in parts per million (ρ = 0.001).</summary>
        public const int ClockRateBoundPpm = 1000;

        /// <summary>The most the lost signal fires ahead of the local deadline, in milliseconds.</summary>
        public const int LostMarginMs = 5;

        /// <summary>How often, at least, a client holding locks compares their deadlines with its clock, in milliseconds.</summary>
        public const int LostCheckMs = 250;
    }

    /// <summary>Operation codes (the <c>op</c> byte of every frame).</summary>
    public enum Op : byte
    {
        /// <summary>Client, first frame: version, session id, client nonce.</summary>
        Hello = 0x01,

        /// <summary>Server: status, version, flags, detail, server nonce, data.</summary>
        Challenge = 0x02,

        /// <summary>Client: the client proof.</summary>
        Auth = 0x03,

        /// <summary>Server: status, resumed flag, session grace, state id, server proof.</summary>
        Welcome = 0x04,

        /// <summary>Take a key for <c>lease_ms</c>, waiting up to <c>wait_ms</c> in the FIFO queue.</summary>
        Acquire = 0x10,

        /// <summary>Release a key held with a token.</summary>
        Release = 0x11,

        /// <summary>Set the lease of a key held with a token to <c>lease_ms</c> from now.</summary>
        Extend = 0x12,

        /// <summary>Withdraw this session's <c>ACQUIRE</c> whose request id is in <c>token</c>.</summary>
        Cancel = 0x13,

        /// <summary>Liveness; answered OK.</summary>
        Ping = 0x14,

        /// <summary>Report a key's state.</summary>
        Inspect = 0x15,

        /// <summary>The lowest request id still awaited: the server may drop stored outcomes below it.</summary>
        Ack = 0x16,

        /// <summary>Push: the lock on a key with a token is lost; <c>detail</c> is the reason.</summary>
        Expired = 0x20,

        /// <summary>Push: this node is going away; <c>data</c> is the leader's address.</summary>
        Goaway = 0x21,
    }

    /// <summary>Status codes of answers, <c>CHALLENGE</c> and <c>WELCOME</c>.</summary>
    public enum Status : byte
    {
        /// <summary>Done.</summary>
        Ok = 0,

        /// <summary>The wait timeout passed (or a try found the key taken); nothing is held.</summary>
        TimedOut = 1,

        /// <summary>The token is not the key's holder (or a retried acquire holds nothing).</summary>
        NotHeld = 2,

        /// <summary>Bad request; <c>detail</c> is the <see cref="InvalidField"/>.</summary>
        Invalid = 3,

        /// <summary>This node is not the leader; <c>data</c> is the leader's address, or empty.</summary>
        NotLeader = 4,

        /// <summary>A server limit was reached; <c>detail</c> is the <see cref="BusyLimit"/>.</summary>
        Busy = 5,

        /// <summary>The server is stopping.</summary>
        ShuttingDown = 6,

        /// <summary>The handshake proof did not verify.</summary>
        AuthFailed = 7,

        /// <summary>The server does not speak this protocol version.</summary>
        UnsupportedVersion = 8,

        /// <summary>The <c>ACQUIRE</c> was withdrawn by <c>CANCEL</c>.</summary>
        Cancelled = 9,
    }

    /// <summary>The field an <c>INVALID</c> answer names (its <c>detail</c>).</summary>
    public enum InvalidField : uint
    {
        /// <summary>Frame length inconsistent with its layout or above the ceiling.</summary>
        Length = 1,

        /// <summary>Unknown operation.</summary>
        Op = 2,

        /// <summary>Reserved flags are not zero.</summary>
        Flags = 3,

        /// <summary>Key empty or longer than the server's limit.</summary>
        Key = 4,

        /// <summary>Lease outside the server's range.</summary>
        Lease = 5,

        /// <summary>Reserved; never sent in version 1.</summary>
        Wait = 6,

        /// <summary>Token is zero where one is needed.</summary>
        Token = 7,

        /// <summary>Request id zero, reused, or a retry that differs from its original.</summary>
        RequestId = 8,

        /// <summary>Reserved: handshake frames with a bad layout close without an answer.</summary>
        Handshake = 9,

        /// <summary><c>HELLO</c>'s session id is all zero.</summary>
        Session = 10,
    }

    /// <summary>The limit a <c>BUSY</c> answer names (its <c>detail</c>).</summary>
    public enum BusyLimit : uint
    {
        /// <summary>Too many connections (in <c>CHALLENGE</c>).</summary>
        Connections = 1,

        /// <summary>The key's queue is full.</summary>
        WaitersPerKey = 2,

        /// <summary>The server's total of queued acquires is reached.</summary>
        WaitersTotal = 3,

        /// <summary>The server's number of distinct keys is reached.</summary>
        Locks = 4,

        /// <summary>The session has too many queued acquires or stored outcomes.</summary>
        Inflight = 5,

        /// <summary>Tokens or the restart horizon cannot be made durable now.</summary>
        Storage = 6,

        /// <summary>Too many sessions (in <c>WELCOME</c>).</summary>
        Sessions = 7,
    }

    /// <summary>Why the server sent <c>EXPIRED</c>.</summary>
    public enum ExpiredReason : uint
    {
        /// <summary>The lease ran out and the server reclaimed the lock.</summary>
        Lease = 1,

        /// <summary>The server is stopping; the lock will not survive the stop.</summary>
        Stopping = 2,
    }

    /// <summary>Why the server sent <c>GOAWAY</c>.</summary>
    public enum GoawayReason : uint
    {
        /// <summary>This node is no longer the leader.</summary>
        Leadership = 1,

        /// <summary>This cluster node is stopping for maintenance.</summary>
        Stopping = 2,
    }

    /// <summary>Flags of an <c>INSPECT</c> answer.</summary>
    [System.Flags]
    public enum InspectFlags : uint
    {
        /// <summary>No flag.</summary>
        None = 0,

        /// <summary>Somebody holds the key.</summary>
        Held = 1,

        /// <summary>The request's token is the holder's.</summary>
        TokenMatch = 2,

        /// <summary>The asking session holds the key.</summary>
        Session = 4,

        /// <summary>The key waits for storage before its next grant.</summary>
        Stalled = 8,

        /// <summary>The server is in its start-up wait: no grant before it ends (<see cref="LockInfo.LockDelayLeft"/> says when).</summary>
        Startup = 16,
    }
}
