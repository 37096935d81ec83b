using System.Reflection;
using System.Runtime.CompilerServices;

#if MONO
// The SDK-style project (Ticketing.csproj) generates these from its <Version> instead.
[assembly: AssemblyTitle("Ticketing")]
[assembly: AssemblyDescription("The official C# client of the Ticketing lock server")]
[assembly: AssemblyVersion("1.0.0.0")]
[assembly: AssemblyFileVersion("1.0.0.0")]
[assembly: AssemblyInformationalVersion("1.0.0")]
#endif

[assembly: InternalsVisibleTo("Ticketing.Tests")]
