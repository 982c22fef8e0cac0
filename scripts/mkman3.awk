# Section 3 man pages from the public headers: one page per function, its
# synopsis the declaration, its description the comment above it (as
# liburing keeps one page per call). A _sz entry point documents the plain
# name (an inline wrapper passing the struct's size) and gets a .so link.
#   awk -v outdir=DIR -v hdr=sparsebuf.h -v version=X -v date=Y -f mkman3.awk HEADER
function esc(s) {
	gsub(/\\/, "\\e", s)
	if (s ~ /^[.']/)
		s = "\\&" s
	return s
}
function first_sentence(s,    i) {
	gsub(/\n/, " ", s)
	i = index(s, ". ")
	if (i > 0)
		s = substr(s, 1, i - 1)
	sub(/\.$/, "", s)
	if (length(s) > 100)
		s = substr(s, 1, 97) "..."
	return s
}
function emit(proto, text,    name, plain, page, f, n, lines, i) {
	if (!match(proto, /sb_[a-z_0-9]+\(/))
		return
	sub(/\n+$/, "", text)
	name = substr(proto, RSTART, RLENGTH - 1)
	plain = name
	sub(/_sz$/, "", plain)
	page = outdir "/" plain ".3"
	f = toupper(plain)
	print ".TH " f " 3 \"" date "\" \"sparsebuf " version "\" \"sparsebuf Manual\"" > page
	print ".SH NAME" > page
	print plain " \\- " esc(text == "" ? "see sparsebuf(7)" : first_sentence(text)) > page
	print ".SH SYNOPSIS" > page
	print ".nf" > page
	print ".B #include <" hdr ">" > page
	print ".PP" > page
	n = split(proto, lines, "\n")
	for (i = 1; i <= n; i++)
		if (lines[i] != "")
			print esc(lines[i]) > page
	print ".fi" > page
	print ".PP" > page
	print "Link with \\fI\\-lsparsebuf\\fP (\\fBpkg\\-config \\-\\-libs sparsebuf\\fP)." > page
	print ".SH DESCRIPTION" > page
	n = split(text, lines, "\n")
	for (i = 1; i <= n; i++) {
		if (lines[i] == "")
			print ".PP" > page
		else
			print esc(lines[i]) > page
	}
	if (plain != name) {
		print ".PP" > page
		print "\\fB" plain "\\fP, without the size, is an inline function in \\fI" hdr "\\fP that passes the size of the struct this program was compiled with; " name " is what it calls (see \\fBsparsebuf\\fP(7), STRUCTS THAT GROW)." > page
		print ".so man3/" plain ".3" > (outdir "/" name ".3")
		close(outdir "/" name ".3")
	}
	print ".SH RETURN VALUE" > page
	print "Functions returning int or long return a value >= 0 on success and \\-errno on failure; constructors return NULL and store \\-errno in *err when err is not NULL. The errors are listed above." > page
	print ".SH SEE ALSO" > page
	print "\\fBsparsebuf\\fP(7), docs/api.md in the source tree" > page
	close(page)
	count++
}
BEGIN { incomment = 0; comment = ""; proto = ""; inproto = 0; skipping = 0; inelse = 0; last_proto = 0 }
/^static inline/ { skipping = 1 }
skipping { if ($0 ~ /^}/) skipping = 0; next }
/^#else/ { inelse = 1; next }
/^#endif/ { inelse = 0; next }
inelse { next }
/^\/\*/ {
	incomment = 1
	comment = ""
	last_proto = 0
}
incomment {
	line = $0
	sub(/^\/\* ?/, "", line)
	sub(/^ \* ?/, "", line)
	sub(/^ \*\/$/, "", line)
	sub(/ ?\*\/$/, "", line)
	if (line ~ /^-+ .* -+$/)	# a section heading, not a description
		line = ""
	else if (line != "" || comment != "")
		comment = comment line "\n"
	if ($0 ~ /\*\//)
		incomment = 0
	next
}
/^$/ { if (last_proto) comment = ""; next }
inproto || /^[a-z].*sb_[a-z_0-9]+\(/ {
	proto = proto $0 "\n"
	inproto = 1
	if ($0 ~ /;/) {
		emit(proto, comment)
		proto = ""
		inproto = 0
		last_proto = 1
	}
	next
}
END { print count " pages from " FILENAME > "/dev/stderr" }
