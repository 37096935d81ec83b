using System;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// The base of every error the client reports. Bad arguments are reported before anything is
    /// sent with the framework's <see cref="ArgumentException"/> family, and a cancelled call with
    /// <see cref="OperationCanceledException"/>, as .NET code expects.
    /// </summary>
    public class TicketingException : Exception
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened, with its context</param>
        public TicketingException(string message)
            : base(message)
        {
        }

        /// <summary>Creates the exception with its cause.</summary>
        /// <param name="message">what happened, with its context</param>
        /// <param name="innerException">the cause</param>
        public TicketingException(string message, Exception innerException)
            : base(message, innerException)
        {
        }
    }

    /// <summary>The wait timeout passed (or a single try found the key taken): nothing is held.</summary>
    public sealed class NotAcquiredException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public NotAcquiredException(string message)
            : base(message)
        {
        }
    }

    /// <summary>The server answered that the token does not hold the key; nothing changed.</summary>
    public sealed class NotHeldException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public NotHeldException(string message)
            : base(message)
        {
        }
    }

    /// <summary>An operation on a lock that is lost, or a scoped lock lost while its body ran.</summary>
    public sealed class LockLostException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="reason">why the lock is lost</param>
        public LockLostException(string message, LostReason reason)
            : base(message)
        {
            Reason = reason;
        }

        /// <summary>Why the lock is lost.</summary>
        public LostReason Reason { get; }
    }

    /// <summary>The server rejected a request as invalid (<c>INVALID</c>); do not retry it unchanged.</summary>
    public sealed class InvalidRequestException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="field">the field the server named</param>
        public InvalidRequestException(string message, InvalidField field)
            : base(message)
        {
            Field = field;
        }

        /// <summary>The field the server named (may be a code this client does not know).</summary>
        public InvalidField Field { get; }
    }

    /// <summary>The acquire asked to refuse a key this client already holds, and it does.</summary>
    public sealed class AlreadyHeldException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public AlreadyHeldException(string message)
            : base(message)
        {
        }
    }

    /// <summary>
    /// The handshake's authentication failed: a wrong token, a server that requires a token when
    /// none is configured, a server that does not when one is, or a server proof that did not verify.
    /// </summary>
    public sealed class AuthFailedException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public AuthFailedException(string message)
            : base(message)
        {
        }
    }

    /// <summary>The server does not speak this client's protocol version.</summary>
    public sealed class UnsupportedVersionException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public UnsupportedVersionException(string message)
            : base(message)
        {
        }
    }

    /// <summary>No endpoint could be connected to (refused, unreachable, timed out).</summary>
    public sealed class UnavailableException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="innerException">the cause, or null</param>
        public UnavailableException(string message, Exception innerException = null)
            : base(message, innerException)
        {
        }
    }

    /// <summary>The TLS handshake failed (including TLS spoken to a plaintext server and back).</summary>
    public sealed class TlsException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="innerException">the cause, or null</param>
        public TlsException(string message, Exception innerException = null)
            : base(message, innerException)
        {
        }
    }

    /// <summary>A request got no answer within the request timeout (a frozen or half-open server).</summary>
    public sealed class RequestTimeoutException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public RequestTimeoutException(string message)
            : base(message)
        {
        }

        /// <summary>Creates the exception with its cause.</summary>
        /// <param name="message">what happened</param>
        /// <param name="innerException">the cause (the last connect error while reconnecting), or null</param>
        public RequestTimeoutException(string message, Exception innerException)
            : base(message, innerException)
        {
        }
    }

    /// <summary>
    /// The connection dropped and the session could not be resumed: the outcome of the request is
    /// unknown (an acquire may have been granted; that lock then runs out its lease).
    /// </summary>
    public sealed class ConnectionLostException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="innerException">the cause, or null</param>
        public ConnectionLostException(string message, Exception innerException = null)
            : base(message, innerException)
        {
        }
    }

    /// <summary>The server restarted (its state id changed) while the call was in flight.</summary>
    public sealed class ServerRestartedException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public ServerRestartedException(string message)
            : base(message)
        {
        }
    }

    /// <summary>A server limit was reached (<c>BUSY</c>); retry later with backoff.</summary>
    public sealed class BusyException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="limit">the limit the server named</param>
        public BusyException(string message, BusyLimit limit)
            : base(message)
        {
            Limit = limit;
        }

        /// <summary>The limit the server named (may be a code this client does not know).</summary>
        public BusyLimit Limit { get; }
    }

    /// <summary>The server is shutting down.</summary>
    public sealed class ShuttingDownException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public ShuttingDownException(string message)
            : base(message)
        {
        }
    }

    /// <summary>The client was closed.</summary>
    public sealed class ClosedException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        public ClosedException(string message)
            : base(message)
        {
        }
    }

    /// <summary>The server sent something this client cannot use (a malformed frame, an unknown status).</summary>
    public sealed class ProtocolException : TicketingException
    {
        /// <summary>Creates the exception.</summary>
        /// <param name="message">what happened</param>
        /// <param name="innerException">the cause, or null</param>
        public ProtocolException(string message, Exception innerException = null)
            : base(message, innerException)
        {
        }
    }
}
