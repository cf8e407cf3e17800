//! Verify faults planted on purpose, so the engine's tests can show their checks catch them. They exist only with the
//! `planted-faults` feature (the engine's own tests turn it on); without it every check below is a constant `false`
//! and the binary carries no fault switch.

use super::EngineConfig;

/// Verify faults the drafting tests plant to prove they turn red.
#[cfg(feature = "planted-faults")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedFault {
    /// The token after the last kept draft is drawn from the row before it.
    BonusFromWrongRow,
    /// Each draft is compared with the draw keyed one position later.
    DrawAtWrongPosition,
    /// Held drafts are written into their window one row late (the host's rows no longer match what the device
    /// verified).
    HeldPicksShifted,
}

/// The fault a core runs with, read from its config: nothing unless the feature is on and a test planted one.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Planted {
    #[cfg(feature = "planted-faults")]
    fault: Option<PlantedFault>,
}

impl Planted {
    /// The fault `cfg` plants.
    pub(super) fn of(_cfg: &EngineConfig) -> Self {
        Self {
            #[cfg(feature = "planted-faults")]
            fault: _cfg.planted,
        }
    }

    /// Some fault is planted (decode windows then copy their logits, which the bonus fault draws from).
    pub(super) fn any(self) -> bool {
        #[cfg(feature = "planted-faults")]
        return self.fault.is_some();
        #[cfg(not(feature = "planted-faults"))]
        false
    }

    /// `PlantedFault::BonusFromWrongRow` is planted.
    pub(super) fn bonus_from_wrong_row(self) -> bool {
        #[cfg(feature = "planted-faults")]
        return self.fault == Some(PlantedFault::BonusFromWrongRow);
        #[cfg(not(feature = "planted-faults"))]
        false
    }

    /// `PlantedFault::DrawAtWrongPosition` is planted.
    pub(super) fn draw_at_wrong_position(self) -> bool {
        #[cfg(feature = "planted-faults")]
        return self.fault == Some(PlantedFault::DrawAtWrongPosition);
        #[cfg(not(feature = "planted-faults"))]
        false
    }

    /// `PlantedFault::HeldPicksShifted` is planted.
    pub(super) fn held_picks_shifted(self) -> bool {
        #[cfg(feature = "planted-faults")]
        return self.fault == Some(PlantedFault::HeldPicksShifted);
        #[cfg(not(feature = "planted-faults"))]
        false
    }
}
