using System.Runtime.CompilerServices;

// The assembly's title, description and version come from Ticketing.csproj: the .NET SDK
// generates them from its properties, and build.sh / package.sh (Mono) generate the same
// attributes from the same properties. None of them may be written here (a second copy would
// be an error under the SDK, CS0579).
[assembly: InternalsVisibleTo("Ticketing.Tests")]
