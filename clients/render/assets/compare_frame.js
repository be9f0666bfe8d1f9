// xattn compare: runs inside each embedded inspector (its scope): lets the outer page set the
// time range, so that both sides keep the same axis.
window.xattn.setRange = (v0, v1) => {
  if (S.v0 === v0 && S.v1 === v1) return;
  S.v0 = v0; S.v1 = v1; schedule();
};
