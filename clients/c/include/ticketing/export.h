/*
 * ticketing/export.h - TK_API marks the public functions of libticketing.
 *
 * The library is built with -fvisibility=hidden: only the functions declared with TK_API in
 * <ticketing/ticketing.h> and <ticketing/wire.h> are exported from the shared library; its
 * internal functions (tk__*) are not. Programs never need to define anything.
 */
#ifndef TICKETING_EXPORT_H
#define TICKETING_EXPORT_H

#ifndef TK_API
#if defined(__GNUC__) || defined(__clang__)
#define TK_API __attribute__((visibility("default")))
#else
#define TK_API
#endif
#endif

#endif /* TICKETING_EXPORT_H */
