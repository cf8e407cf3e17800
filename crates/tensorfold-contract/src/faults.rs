//! Planted faults named by enums: the [`FaultKind`] each kernel's fault enum implements, the [`faults!`] macro that
//! declares one, and the [`Fault`] a report shows.

/// A deliberate fault a kernel's gates must catch, as a report shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Short name (kebab-case, e.g. `dropped-last-column`).
    pub name: &'static str,
    /// What the planted code does wrong.
    pub what: &'static str,
}

/// A kernel's fault enum: every variant, in report order, with its name and what it does wrong.
pub trait FaultKind: Copy + PartialEq + std::fmt::Debug + 'static {
    /// Every fault, in the order the controls run and are reported.
    const ALL: &'static [Self];
    /// Short name.
    fn name(self) -> &'static str;
    /// What the planted code does wrong.
    fn what(self) -> &'static str;
    /// As a report shows it.
    fn describe(self) -> Fault {
        Fault { name: self.name(), what: self.what() }
    }
}

/// Declares a kernel's fault enum: `Variant = ("name", "what it does wrong")` for each, in report order.
macro_rules! faults {
    ($(#[$m:meta])* enum $name:ident { $($v:ident = ($n:literal, $w:literal $(,)?)),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum $name {
            $(#[doc = $w] $v),*
        }
        impl $crate::FaultKind for $name {
            const ALL: &'static [Self] = &[$(Self::$v),*];
            fn name(self) -> &'static str {
                match self {
                    $(Self::$v => $n),*
                }
            }
            fn what(self) -> &'static str {
                match self {
                    $(Self::$v => $w),*
                }
            }
        }
    };
}
