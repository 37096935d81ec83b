using System;
using System.Diagnostics;
using System.Threading;

namespace Ticketing
{
    /// <summary>A completion: it completes a caller's task, whose continuations run inline, on the thread that runs it.</summary>
    internal interface ICompletion
    {
        /// <summary>Completes the task.</summary>
        void Run();
    }

    /// <summary>
    /// Where completions run: those of answers the reader thread just decoded run on that thread
    /// once it let every lock go (<see cref="Connection"/>'s remarks: it gives the reading to
    /// another thread when one runs long); every other one (a timeout on the timer thread, a
    /// cancellation, a close) runs on the thread pool. Never on the posting thread, never under
    /// the client's locks.
    /// </summary>
    internal static class Completions
    {
        private static readonly WaitCallback OnPool = state => RunSafely((ICompletion)state);

        /// <summary>Runs <paramref name="c"/> later: on the reader thread that posts it, after its frame, else on the pool.</summary>
        internal static void Post(ICompletion c)
        {
            if (!Connection.TryDefer(c))
            {
                ThreadPool.UnsafeQueueUserWorkItem(OnPool, c);
            }
        }

        internal static void RunSafely(ICompletion c)
        {
            try
            {
                c.Run();
            }
            catch (Exception e)
            {
                // A completion only completes a task; the continuations keep their own exceptions.
                Engine.Log.TraceEvent(TraceEventType.Error, 0, "a completion failed: {0}", e);
            }
        }
    }
}
